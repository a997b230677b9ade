"""Which tests a machine runs.

requires_cuda: needs a CUDA build of torch and a visible GPU. Without them the
test skips with the reason, unless TORCH_FALLBACK_REQUIRE_GPU=1 (set by GPU
runners), where a missing GPU fails the test: a GPU job that cannot see its GPU
must not pass by skipping everything.

cpu_wheel / cuda_wheel: behaviour of one kind of torch build; on the other kind
the test skips with the reason (the matrix runs each kind in its own cell).
"""

from __future__ import annotations

import os

import pytest

REQUIRE_GPU_ENV = "TORCH_FALLBACK_REQUIRE_GPU"


def gpu_requirement() -> bool:
    return os.environ.get(REQUIRE_GPU_ENV, "").strip().lower() in {"1", "true", "yes"}


def missing_gpu_reason() -> str | None:
    """Why no GPU test can run here, or None when one can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} was built without CUDA"
    if torch.cuda.device_count() == 0:
        return f"no CUDA GPU is visible (torch {torch.__version__})"
    return None


def torch_built_with_cuda() -> bool | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.backends.cuda.is_built()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    checked = False
    missing_gpu: str | None = None
    built_with_cuda: bool | None = None
    for item in items:
        markers = {mark.name for mark in item.iter_markers()}
        if not markers & {"requires_cuda", "cpu_wheel", "cuda_wheel"}:
            continue
        if not checked:
            missing_gpu, built_with_cuda, checked = (
                missing_gpu_reason(),
                torch_built_with_cuda(),
                True,
            )
        if "requires_cuda" in markers and missing_gpu is not None and not gpu_requirement():
            item.add_marker(pytest.mark.skip(reason=f"requires_cuda: {missing_gpu}"))
        if "cpu_wheel" in markers and built_with_cuda:
            item.add_marker(pytest.mark.skip(reason="cpu_wheel: torch here is a CUDA build"))
        if "cuda_wheel" in markers and built_with_cuda is False:
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
