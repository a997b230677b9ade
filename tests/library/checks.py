"""Assertions on the fallback's metrics and results, shared by the extension's tests."""

from __future__ import annotations

import torch

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


def unboxed_calls() -> int:
    return sum(m.calls_unboxed for m in torch_fallback.metrics().values())


def served_unboxed(placement) -> bool:
    """Whether relay's memory is where the ops run, so the unboxed kernels serve them."""
    return placement.target == placement.home


def unboxed(op: str) -> int:
    """The calls of `op` an unboxed kernel served, since the last reset."""
    stats = torch_fallback.metrics().get(op)
    return 0 if stats is None else stats.calls_unboxed


def assert_unboxed_where_served(ops: list[str], placement) -> None:
    """Each of `ops` reached the fallback, unboxed where relay's memory is on the target;
    elsewhere the boxed fallback copies the tensors to the target and back."""
    metrics = torch_fallback.metrics()
    for op in ops:
        counted = metrics.get(op)
        assert counted is not None and counted.calls > 0, f"{op} did not reach the fallback"
        assert (counted.calls_unboxed > 0) == served_unboxed(placement), op


def eager_on_target(placement):
    """Puts a CPU tensor where eager runs what relay runs: on the fallback's target.
    For references that need no CUDA autograd (pytorch/pytorch#161129)."""
    return lambda t: t.to(placement.target)


def run_both(call):
    torch.manual_seed(0)
    expected = call(lambda t: t)
    torch.manual_seed(0)
    actual = call(lambda t: t.to("relay"))
    return actual, expected


def assert_same(actual, expected) -> None:
    if isinstance(expected, (tuple, list)):
        for a, e in zip(actual, expected, strict=True):
            assert_same(a, e)
        return
    if expected is None:
        assert actual is None
        return
    assert actual.device.type == "relay", f"result on {actual.device}"
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu().resolve_conj(), expected.cpu().resolve_conj())
