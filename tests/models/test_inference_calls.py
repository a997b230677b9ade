"""Launch-bound inference pays no boxed call: every op of a zoo model's eval forward
and of its greedy ``generate()`` has an unboxed kernel on relay.

A boxed call costs several times an unboxed one's host time, and a decode loop makes
its calls once per token: one op left to the boxed fallback (generate()'s stopping
check, a mixture of experts' routing) shows in every token. Where relay's memory is
not on the fallback's target, every call is boxed: it copies the tensors there.
"""

from __future__ import annotations

import pytest
import zoo
from zoo_runner import run_inference

import torch_fallback
import torch_fallback.relay

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _param(name: str) -> object:
    return pytest.param(name, id=name, marks=() if name in zoo.CORE else pytest.mark.slow)


def calls_by_kind() -> tuple[dict[str, int], int]:
    """The boxed calls by op, and the number of unboxed calls, since the last reset."""
    metrics = torch_fallback.metrics()
    boxed = {
        op: m.calls - m.calls_unboxed for op, m in metrics.items() if m.calls > m.calls_unboxed
    }
    return boxed, sum(m.calls_unboxed for m in metrics.values())


@pytest.mark.parametrize("name", [_param(entry.name) for entry in zoo.ZOO])
def test_inference_makes_no_boxed_call_where_relay_memory_is_on_the_target(name, placement):
    model, case = zoo.make_case(name, 0)
    model.to("relay")
    torch_fallback.reset_metrics()
    run_inference(name, model, case, "relay")
    boxed, unboxed = calls_by_kind()
    if placement.target == placement.home:
        assert unboxed > 0, f"{name}: no call reached the unboxed kernels"
        assert boxed == {}, f"{name} ({placement}): boxed calls {boxed}"
    else:
        assert unboxed == 0 and boxed, f"{name} ({placement}): {unboxed} unboxed calls"
