"""Which engine served a backend's calls: for tests that launch-bound code (a decode
loop, a training step) pays no boxed call.

An unboxed kernel (register_kernels) serves a call whose tensors all live on the
fallback's target; the boxed fallback serves the rest, at more host time. out= ops
(their kernels may resize the output) and ops that take a device or a layout (factories)
are always the boxed fallback's.

    torch_fallback.reset_metrics()
    model.generate(...)
    assert not unservable_boxed_calls(), "a decode step pays a boxed call"

assert_served_as_placed() checks both that and its converse where the memory is elsewhere.
"""

from __future__ import annotations

import torch

import torch_fallback


def boxed_calls(metrics=None) -> dict[str, int]:
    """The calls the boxed fallback served since the last reset_metrics(), by op
    (`metrics`: torch_fallback.metrics(), if read already)."""
    metrics = torch_fallback.metrics() if metrics is None else metrics
    return {op: m.calls - m.calls_unboxed for op, m in metrics.items() if m.calls > m.calls_unboxed}


def served_boxed_only(op: str) -> bool:
    """Whether `op` ("aten::name.overload") is one the unboxed kernels leave to the boxed
    fallback by its schema: an out= op, or one that takes a device or a layout."""
    name, _, overload = op.removeprefix("aten::").partition(".")
    schema = torch._C._get_schema(f"aten::{name}", overload)
    return any(
        argument.is_out or any(kind in str(argument.type) for kind in ("Device", "Layout"))
        for argument in schema.arguments
    )


def has_target_kernels(op: str, metrics=None) -> bool:
    """Whether `op` has a kernel of its own on each target its calls since the last
    reset_metrics() ran on (`metrics`: torch_fallback.metrics()[op], if read already):
    where it has none (CUDA's fused recurrent cells on the CPU), the boxed fallback runs
    a decomposition, which no unboxed kernel can."""
    m = torch_fallback.metrics()[op] if metrics is None else metrics
    targets = [key for key, calls in (("CPU", m.calls_cpu), ("CUDA", m.calls_cuda)) if calls]
    return all(torch._C._dispatch_has_computed_kernel_for_dispatch_key(op, key) for key in targets)


def unservable_boxed_calls() -> dict[str, int]:
    """The boxed calls since the last reset_metrics() of ops an unboxed kernel could have
    served (see served_boxed_only and has_target_kernels), by op: empty where every such
    op has one and every call's tensors lived on the target."""
    metrics = torch_fallback.metrics()
    return {
        op: calls
        for op, calls in boxed_calls(metrics).items()
        if not served_boxed_only(op) and has_target_kernels(op, metrics[op])
    }


def unboxed_ops() -> set[str]:
    """The ops an unboxed kernel served since the last reset_metrics()."""
    return {op for op, m in torch_fallback.metrics().items() if m.calls_unboxed}


def assert_served_as_placed(memory_on_target: bool, what: str = "the calls") -> None:
    """Where the backend's memory lives on the fallback's target: some calls since the last
    reset_metrics() ran unboxed, and none was boxed that an unboxed kernel could have
    served. Elsewhere: calls were boxed (they copy to the target), and none ran unboxed
    but item()'s, which reads where the memory is."""
    unboxed = unboxed_ops()
    if memory_on_target:
        assert unboxed, f"{what}: no call reached the unboxed kernels"
        boxed = unservable_boxed_calls()
        assert not boxed, f"{what}: boxed calls an unboxed kernel could serve: {boxed}"
    else:
        assert unboxed <= {"aten::_local_scalar_dense"}, f"{what}: unboxed calls of {unboxed}"
        assert boxed_calls(), f"{what}: no boxed call"
