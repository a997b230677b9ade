"""pytest plugin: which tests a machine runs, by its torch build and its GPUs.

Enable it in the root conftest.py of a backend's tests::

    pytest_plugins = ["torch_fallback.testing.plugin"]

or on the command line: ``pytest -p torch_fallback.testing.plugin``. It registers
these markers (so ``--strict-markers`` accepts them) and applies their rules:

requires_cuda
    needs a CUDA build of torch and a visible GPU. Without them the test skips with
    the reason, unless TORCH_FALLBACK_REQUIRE_GPU=1 (set it on GPU runners), where a
    missing GPU FAILS the test: a GPU job that cannot see its GPU must not pass by
    skipping everything.
requires_two_gpus
    with requires_cuda: skips where fewer than two GPUs are visible.
cpu_wheel / cuda_wheel
    behaviour of one kind of torch build (CPU-only, or CUDA with or without a GPU);
    on the other kind the test skips with the reason.

Select with ``-m``, e.g. ``-m "not requires_cuda"`` on a machine without a GPU and
``-m requires_cuda`` with TORCH_FALLBACK_REQUIRE_GPU=1 on a GPU runner.
"""

from __future__ import annotations

import os

import pytest
import torch

from torch_fallback._loader import torch_built_with_cuda

REQUIRE_GPU_ENV = "TORCH_FALLBACK_REQUIRE_GPU"

MARKERS = {
    "requires_cuda": "needs a CUDA build of torch AND a visible GPU; skipped without one "
    f"unless {REQUIRE_GPU_ENV}=1, where a missing GPU fails",
    "requires_two_gpus": "needs two visible GPUs (with requires_cuda); skipped where fewer "
    "are visible",
    "cpu_wheel": "checks behaviour specific to a CPU-only torch build (skipped on a CUDA build)",
    "cuda_wheel": "checks behaviour specific to a CUDA torch build, GPU or not (skipped on a "
    "CPU-only build)",
}


def gpu_required() -> bool:
    """Whether TORCH_FALLBACK_REQUIRE_GPU asks for a GPU (a missing one fails requires_cuda)."""
    return os.environ.get(REQUIRE_GPU_ENV, "").strip().lower() in {"1", "true", "yes"}


def missing_gpu_reason() -> str | None:
    """Why no GPU test can run here, or None when one can."""
    if not torch_built_with_cuda():
        return f"torch {torch.__version__} was built without CUDA"
    if torch.cuda.device_count() == 0:
        return f"no CUDA GPU is visible (torch {torch.__version__})"
    return None


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The machine, asked once and only if a test is marked: why no GPU test can run (or
    # None), whether torch was built with CUDA, how many GPUs are visible.
    machine: tuple[str | None, bool, int] | None = None
    for item in items:
        markers = {mark.name for mark in item.iter_markers()}
        if not markers & MARKERS.keys():
            continue
        if machine is None:
            missing = missing_gpu_reason()
            gpus = 0 if missing else torch.cuda.device_count()
            machine = (missing, torch_built_with_cuda(), gpus)
        missing_gpu, built_with_cuda, gpus = machine
        if "requires_cuda" in markers and missing_gpu is not None and not gpu_required():
            item.add_marker(pytest.mark.skip(reason=f"requires_cuda: {missing_gpu}"))
        elif "requires_two_gpus" in markers and missing_gpu is None and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"requires_two_gpus: {gpus} visible"))
        if "cpu_wheel" in markers and built_with_cuda:
            item.add_marker(pytest.mark.skip(reason="cpu_wheel: torch here is a CUDA build"))
        if "cuda_wheel" in markers and not built_with_cuda:
            item.add_marker(pytest.mark.skip(reason="cuda_wheel: torch here is a CPU-only build"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("requires_cuda") is None or not gpu_required():
        return
    missing_gpu = missing_gpu_reason()
    if missing_gpu is not None:
        pytest.fail(
            f"{REQUIRE_GPU_ENV}=1 but {missing_gpu}: this runner is meant to have a GPU. "
            "Check the runner's driver (nvidia-smi), the container's GPU passthrough and "
            "CUDA_VISIBLE_DEVICES.",
            pytrace=False,
        )
