"""Markers for tinydev's tests, with the same rules as torch-fallback's own tests.

requires_cuda: needs a CUDA build of torch and a visible GPU. Without them the
test skips with the reason, unless TORCH_FALLBACK_REQUIRE_GPU=1 (set by GPU
runners), where a missing GPU fails the test.

cpu_wheel / cuda_wheel: behaviour of one kind of torch build; on the other kind
the test skips with the reason.
"""

from __future__ import annotations

import os

import pytest
import torch

REQUIRE_GPU_ENV = "TORCH_FALLBACK_REQUIRE_GPU"

MARKERS = {
    "requires_cuda": "needs a CUDA build of torch AND a visible GPU; skipped without one "
    f"unless {REQUIRE_GPU_ENV}=1, where a missing GPU fails",
    "cpu_wheel": "checks behaviour of a CPU-only torch build (skipped on a CUDA build)",
    "cuda_wheel": "checks behaviour of a CUDA torch build, GPU or not "
    "(skipped on a CPU-only build)",
}


def pytest_configure(config: pytest.Config) -> None:
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")


def gpu_requirement() -> bool:
    return os.environ.get(REQUIRE_GPU_ENV, "").strip().lower() in {"1", "true", "yes"}


def missing_gpu_reason() -> str | None:
    """Why no GPU test can run here, or None when one can."""
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} was built without CUDA"
    if torch.cuda.device_count() == 0:
        return f"no CUDA GPU is visible (torch {torch.__version__})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing_gpu = missing_gpu_reason()
    built_with_cuda = torch.backends.cuda.is_built()
    for item in items:
        if item.get_closest_marker("requires_cuda") and missing_gpu and not gpu_requirement():
            item.add_marker(pytest.mark.skip(reason=f"requires_cuda: {missing_gpu}"))
        if item.get_closest_marker("cpu_wheel") and built_with_cuda:
            item.add_marker(pytest.mark.skip(reason="cpu_wheel: torch here is a CUDA build"))
        if item.get_closest_marker("cuda_wheel") and not built_with_cuda:
            item.add_marker(pytest.mark.skip(reason="cuda_wheel: torch here is a CPU-only build"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("requires_cuda") is None or not gpu_requirement():
        return
    missing_gpu = missing_gpu_reason()
    if missing_gpu is not None:
        pytest.fail(
            f"{REQUIRE_GPU_ENV}=1 but {missing_gpu}: this runner is meant to have a GPU. "
            "Check the runner's driver (nvidia-smi), the container's GPU passthrough and "
            "CUDA_VISIBLE_DEVICES.",
            pytrace=False,
        )
