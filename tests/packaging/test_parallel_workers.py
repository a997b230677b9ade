"""The cells run their tests on pytest-xdist workers (matrix.yaml tests.workers): each
worker's torch, and the processes its tests start, use the worker's share of the cores
(tests/conftest.py), so that two workers on two cores do not run four threads."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
XDIST_ENV = ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")

# Two tests, so that each of the two workers runs one.
WORKER_TESTS = """
import os, subprocess, sys
import pytest
import torch

@pytest.mark.parametrize("number", [1, 2])
def test_the_worker_uses_its_share(number):
    expected = int(os.environ["EXPECTED_THREADS"])
    assert torch.get_num_threads() == expected
    child = "import torch; print(torch.get_num_threads())"
    seen = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert seen.stdout.strip() == str(expected), seen.stderr
"""


def root_conftest() -> ModuleType:
    """tests/conftest.py as a module of its own (its dataclass needs it in sys.modules)."""
    name = "root_conftest_under_test"
    spec = importlib.util.spec_from_file_location(name, CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


@pytest.mark.parametrize(
    ("environ", "cpus", "threads"),
    [
        ({"PYTEST_XDIST_WORKER_COUNT": "2"}, 2, 1),
        ({"PYTEST_XDIST_WORKER_COUNT": "2"}, 16, 8),
        ({"PYTEST_XDIST_WORKER_COUNT": "3"}, 2, 1),
        ({"PYTEST_XDIST_WORKER_COUNT": "1"}, 4, 4),
        ({}, 16, None),  # not under xdist: torch's own choice
        ({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, 16, None),  # the user's
    ],
)
def test_a_worker_gets_its_share_of_the_cores(environ, cpus, threads):
    assert root_conftest().worker_threads(environ, cpus) == threads


@pytest.mark.slow
def test_two_workers_on_this_machine_share_its_cores(tmp_path):
    pytest.importorskip("xdist", reason="pytest-xdist is in the test dependency group")
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_threads.py").write_text(WORKER_TESTS, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in (*XDIST_ENV, "OMP_NUM_THREADS")}
    env["EXPECTED_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // 2))
    command = [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q"]
    command += ["--rootdir", str(tmp_path), str(tmp_path)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout
