"""Threads, version mismatch at import: the fallback under conditions users create."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import torch_fallback
import torch_fallback.relay

THREADS = 8
ROUNDS = 25


def test_eight_threads_get_eager_results_and_exact_metrics():
    torch.manual_seed(0)
    inputs = [torch.randn(64, 32) for _ in range(THREADS)]
    expected = [(torch.nonzero(x > 0), torch.sort(x, dim=1).values, x.cumsum(0)) for x in inputs]
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def worker(index: int) -> None:
        x = inputs[index].to("relay")
        start.wait()
        for round_ in range(ROUNDS):
            got = (torch.nonzero(x > 0), torch.sort(x, dim=1).values, x.cumsum(0))
            for g, e in zip(got, expected[index], strict=True):
                if not torch.equal(g.cpu(), e):
                    failures.append(f"thread {index} round {round_}: result differs from eager")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures[:5]
    metrics = torch_fallback.metrics()
    for op in ("aten::nonzero", "aten::sort.stable", "aten::cumsum"):
        assert metrics[op].calls == THREADS * ROUNDS, (op, metrics[op])


def test_metrics_time_is_the_calls_time_in_nanoseconds(fallback_settings):
    # Calls time themselves in ticks of the CPU's time-stamp counter where it runs at a
    # constant rate; the metrics convert them. Matrix products on the CPU target spend
    # nearly all of a loop's time inside the fallback.
    torch_fallback.set_target("cpu")
    torch_fallback.relay.set_home("cpu")
    x = torch.randn(256, 256).to("relay")
    torch.mm(x, x)
    torch_fallback.reset_metrics()
    start = time.perf_counter_ns()
    for _ in range(20):
        torch.mm(x, x)
    wall_ns = time.perf_counter_ns() - start
    spent_ns = torch_fallback.metrics()["aten::mm"].time_ns
    assert 0.5 * wall_ns < spent_ns <= wall_ns, (spent_ns, wall_ns)


@pytest.mark.requires_cuda
def test_target_tensors_of_finished_calls_hold_no_gpu_memory():
    # The fallback reuses the TensorImpls of finished calls: each must let go of
    # the memory it viewed when its call ends, or freed relay tensors would not be.
    torch_fallback.set_target("cuda")
    torch_fallback.relay.set_home("cuda")
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    xs = [torch.randn(1 << 18).to("relay") for _ in range(8)]
    torch._foreach_add_(xs, 1.0)
    sums = [x.sum() for x in xs]
    assert torch_fallback.metrics()["aten::_foreach_add_.Scalar"].calls_cuda == 1
    del xs, sums
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


def test_extension_built_for_another_torch_raises_a_clear_import_error(tmp_path):
    installed = Path(torch_fallback.__file__).parent
    copy = tmp_path / "torch_fallback"
    shutil.copytree(installed, copy, ignore=shutil.ignore_patterns("csrc", "__pycache__"))
    (copy / "_build_info.json").write_text(
        json.dumps({"torch_version": "2.99.1+cpu", "cuda_version": None})
    )
    completed = subprocess.run(
        [sys.executable, "-c", "import torch_fallback"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
    )
    assert completed.returncode != 0
    last_line = completed.stderr.strip().splitlines()[-1]
    assert last_line.startswith(
        "ImportError: torch_fallback's extension was built against torch 2.99.1+cpu"
    )
    assert str(torch.__version__) in last_line
    assert "pip install --no-build-isolation" in last_line
    assert "undefined symbol" not in completed.stderr


@pytest.mark.parametrize(
    ("variable", "module"),
    [
        ("TORCH_FALLBACK_TARGET", "torch_fallback"),
        ("TORCH_FALLBACK_RELAY_HOME", "torch_fallback.relay"),
    ],
)
def test_bad_environment_fails_the_import_clearly(tmp_path, variable, module):
    completed = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, variable: "gpu"},
    )
    assert completed.returncode != 0
    assert (
        completed.stderr.strip().splitlines()[-1].startswith("ValueError: torch_fallback: unknown")
    )
