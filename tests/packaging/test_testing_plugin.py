"""torch_fallback.testing.plugin, as a backend's tests use it: its markers skip, run or fail
a test by the torch build and the GPUs of the machine.

Each test runs a small test file in a pytest of its own (pytester; in this process unless
it says otherwise). The machines it stands for are made by replacing what the plugin asks
torch (built with CUDA? how many GPUs?), so every case runs on every machine; one test asks
the real torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import torch_fallback

pytest_plugins = ["pytester"]

PLUGIN = "torch_fallback.testing.plugin"
REQUIRE_GPU_ENV = "TORCH_FALLBACK_REQUIRE_GPU"

MARKED_TESTS = """
import pytest

@pytest.mark.requires_cuda
def test_gpu():
    pass

@pytest.mark.requires_cuda
@pytest.mark.requires_two_gpus
def test_two_gpus():
    pass

@pytest.mark.cpu_wheel
def test_cpu_build():
    pass

@pytest.mark.cuda_wheel
def test_cuda_build():
    pass

def test_unmarked():
    pass
"""

CPU_BUILD = "was built without CUDA"
NO_GPU = "no CUDA GPU is visible"
REQUIRED = f"{REQUIRE_GPU_ENV}=1 but "
CUDA_BUILD_SKIP = "cpu_wheel: torch here is a CUDA build"
CPU_BUILD_SKIP = "cuda_wheel: torch here is a CPU-only build"

# (CUDA build, visible GPUs, TORCH_FALLBACK_REQUIRE_GPU) -> each test's outcome and what
# its report says (the skip's reason, the failure's message)
CASES = {
    (False, 0, None): {
        "test_gpu": ("skipped", f"requires_cuda: torch {torch.__version__} {CPU_BUILD}"),
        "test_two_gpus": ("skipped", f"requires_cuda: torch {torch.__version__} {CPU_BUILD}"),
        "test_cpu_build": ("passed", ""),
        "test_cuda_build": ("skipped", CPU_BUILD_SKIP),
        "test_unmarked": ("passed", ""),
    },
    (False, 0, "1"): {
        "test_gpu": ("failed", f"{REQUIRED}torch {torch.__version__} {CPU_BUILD}"),
        "test_two_gpus": ("failed", f"{REQUIRED}torch {torch.__version__} {CPU_BUILD}"),
        "test_cpu_build": ("passed", ""),
        "test_cuda_build": ("skipped", CPU_BUILD_SKIP),
        "test_unmarked": ("passed", ""),
    },
    (True, 0, None): {
        "test_gpu": ("skipped", f"requires_cuda: {NO_GPU}"),
        "test_two_gpus": ("skipped", f"requires_cuda: {NO_GPU}"),
        "test_cpu_build": ("skipped", CUDA_BUILD_SKIP),
        "test_cuda_build": ("passed", ""),
        "test_unmarked": ("passed", ""),
    },
    (True, 0, "yes"): {
        "test_gpu": ("failed", f"{REQUIRED}{NO_GPU}"),
        "test_two_gpus": ("failed", f"{REQUIRED}{NO_GPU}"),
        "test_cpu_build": ("skipped", CUDA_BUILD_SKIP),
        "test_cuda_build": ("passed", ""),
        "test_unmarked": ("passed", ""),
    },
    (True, 1, "1"): {
        "test_gpu": ("passed", ""),
        "test_two_gpus": ("skipped", "requires_two_gpus: 1 visible"),
        "test_cpu_build": ("skipped", CUDA_BUILD_SKIP),
        "test_cuda_build": ("passed", ""),
        "test_unmarked": ("passed", ""),
    },
    (True, 2, None): {
        "test_gpu": ("passed", ""),
        "test_two_gpus": ("passed", ""),
        "test_cpu_build": ("skipped", CUDA_BUILD_SKIP),
        "test_cuda_build": ("passed", ""),
        "test_unmarked": ("passed", ""),
    },
}


def case_id(case: tuple[bool, int, str | None]) -> str:
    built, gpus, required = case
    build = "cuda-build" if built else "cpu-build"
    return f"{build}-{gpus}-gpus" + (f"-{REQUIRE_GPU_ENV}={required}" if required else "")


def outcomes(pytester: pytest.Pytester, *args: str) -> dict[str, tuple[str, str]]:
    """Each test's outcome and its report's text, from a pytest run in this process."""
    recorder = pytester.inline_run("--strict-markers", "-p", "no:cacheprovider", *args)
    found: dict[str, tuple[str, str]] = {}
    for report in recorder.getreports("pytest_runtest_logreport"):
        name = report.nodeid.rsplit("::", 1)[-1]
        if report.when == "call" or report.outcome != "passed":
            found.setdefault(name, (report.outcome, str(report.longrepr or "")))
    return found


def assert_outcomes(found: dict[str, tuple[str, str]], expected: dict[str, tuple[str, str]]):
    assert {name: outcome for name, (outcome, _) in found.items()} == {
        name: outcome for name, (outcome, _) in expected.items()
    }
    for name, (_, text) in expected.items():
        assert text in found[name][1], (name, found[name][1])


def set_required(monkeypatch: pytest.MonkeyPatch, required: str | None) -> None:
    if required is None:
        monkeypatch.delenv(REQUIRE_GPU_ENV, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_GPU_ENV, required)


@pytest.mark.parametrize("case", list(CASES), ids=case_id)
def test_markers_on_each_kind_of_machine(pytester, monkeypatch, case):
    built, gpus, required = case
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: built)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    set_required(monkeypatch, required)
    pytester.makepyfile(test_marked=MARKED_TESTS)
    assert_outcomes(outcomes(pytester, "-p", PLUGIN), CASES[case])


@pytest.mark.parametrize("required", [None, "1"], ids=["gpu-optional", "gpu-required"])
def test_markers_on_this_machine_through_a_conftest(pytester, monkeypatch, required):
    """The real torch, and the plugin enabled as a backend does: from its root conftest.py."""
    set_required(monkeypatch, required)
    built, gpus = torch.backends.cuda.is_built(), min(torch.cuda.device_count(), 2)
    # with a GPU, requires_cuda runs whatever the variable says
    [expected] = [
        by_test
        for (b, g, r), by_test in CASES.items()
        if (b, g) == (built, gpus) and (gpus > 0 or bool(r) == bool(required))
    ]
    pytester.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    pytester.makepyfile(test_marked=MARKED_TESTS)
    assert_outcomes(outcomes(pytester), expected)


def test_the_markers_are_registered_with_their_rules(pytester):
    pytester.makeconftest(f"pytest_plugins = [{PLUGIN!r}]")
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(
        [
            f"@pytest.mark.requires_cuda: *unless {REQUIRE_GPU_ENV}=1, where a missing GPU fails",
            "@pytest.mark.requires_two_gpus: *",
            "@pytest.mark.cpu_wheel: *",
            "@pytest.mark.cuda_wheel: *",
        ]
    )


@pytest.mark.parametrize("plugin", [True, False], ids=["with-the-plugin", "without-it"])
def test_strict_markers_accept_the_markers_with_the_plugin_only(pytester, monkeypatch, plugin):
    """In a process of its own: pytest remembers the markers it has accepted in a process."""
    found_at = str(Path(torch_fallback.__file__).parents[1])  # where this process found it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([found_at, os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_marked=MARKED_TESTS)
    args = ["--strict-markers", "--collect-only", "-p", "no:cacheprovider"]
    result = pytester.runpytest_subprocess(*args, *(["-p", PLUGIN] if plugin else []))
    if plugin:
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines(["*5 tests collected*"])
    else:
        assert result.ret == pytest.ExitCode.INTERRUPTED
        result.stdout.fnmatch_lines(["*'requires_cuda' not found in `markers` configuration*"])
