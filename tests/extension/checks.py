"""Assertions on the fallback's metrics."""

from __future__ import annotations

import torch_fallback


def calls_on(op: str, target: str) -> int:
    """How often `op` went through the fallback on `target`."""
    stats = torch_fallback.metrics().get(op)
    if stats is None:
        return 0
    return stats.calls_cuda if target == "cuda" else stats.calls_cpu


def assert_fell_back(op: str, target: str) -> None:
    ran = {name: (m.calls_cpu, m.calls_cuda) for name, m in torch_fallback.metrics().items()}
    assert calls_on(op, target) > 0, f"{op} did not go through the {target} fallback; saw {ran}"
