"""Which tests a machine runs.

requires_cuda: needs a CUDA build of torch and a visible GPU. Without them the
test skips with the reason, unless TORCH_FALLBACK_REQUIRE_GPU=1 (set by GPU
runners), where a missing GPU fails the test: a GPU job that cannot see its GPU
must not pass by skipping everything.

cpu_wheel / cuda_wheel: behaviour of one kind of torch build; on the other kind
the test skips with the reason (the matrix runs each kind in its own cell).

The fixtures `fallback_settings` and `placement` (target x home) serve the tests of
the built extension (tests/extension, tests/models); they import torch_fallback
only when a test asks for them, so the tooling's tests run without torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

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


def visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()


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
        if not markers & {"requires_cuda", "requires_two_gpus", "cpu_wheel", "cuda_wheel"}:
            continue
        if not checked:
            missing_gpu, built_with_cuda, checked = (
                missing_gpu_reason(),
                torch_built_with_cuda(),
                True,
            )
        if "requires_cuda" in markers and missing_gpu is not None and not gpu_requirement():
            item.add_marker(pytest.mark.skip(reason=f"requires_cuda: {missing_gpu}"))
        elif "requires_two_gpus" in markers and missing_gpu is None and visible_gpus() < 2:
            item.add_marker(pytest.mark.skip(reason=f"requires_two_gpus: {visible_gpus()} visible"))
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


@dataclass(frozen=True)
class Placement:
    target: str  # where the fallback runs ops: "cpu" or "cuda"
    home: str  # where relay tensors keep their memory: "cpu" or "cuda"

    def __str__(self) -> str:
        return f"target={self.target}-home={self.home}"


PLACEMENTS = [
    pytest.param(Placement("cpu", "cpu"), id="target-cpu-home-cpu"),
    pytest.param(
        Placement("cpu", "cuda"), id="target-cpu-home-cuda", marks=pytest.mark.requires_cuda
    ),
    pytest.param(
        Placement("cuda", "cpu"), id="target-cuda-home-cpu", marks=pytest.mark.requires_cuda
    ),
    pytest.param(
        Placement("cuda", "cuda"), id="target-cuda-home-cuda", marks=pytest.mark.requires_cuda
    ),
]


@pytest.fixture
def fallback_settings() -> Iterator[None]:
    """The test starts from the defaults and leaves torch_fallback's settings as it found them."""
    import torch_fallback
    import torch_fallback.relay

    saved = (
        torch_fallback.get_target(),
        torch_fallback.relay.get_home(),
        torch_fallback.get_cpu_ops(),
        torch_fallback.get_cuda_sync(),
    )
    torch_fallback.reset_metrics()
    yield
    torch_fallback.set_target(saved[0])
    torch_fallback.relay.set_home(saved[1])
    torch_fallback.set_cpu_ops(saved[2])
    torch_fallback.set_cuda_sync(saved[3])


@pytest.fixture(params=PLACEMENTS)
def placement(request: pytest.FixtureRequest, fallback_settings: None) -> Placement:
    """Each placement in turn: the fallback's target and relay's home set for the test."""
    import torch_fallback
    import torch_fallback.relay

    chosen: Placement = request.param
    torch_fallback.set_target(chosen.target)
    torch_fallback.relay.set_home(chosen.home)
    return chosen
