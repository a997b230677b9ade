"""Fixtures for tests of the built extension: placements (target x home) and metrics."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import torch_fallback
import torch_fallback.relay


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


@pytest.fixture(autouse=True)
def _restore_settings():
    """Every test starts from the defaults and leaves them as it found them."""
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
def placement(request) -> Placement:
    chosen: Placement = request.param
    torch_fallback.set_target(chosen.target)
    torch_fallback.relay.set_home(chosen.home)
    return chosen
