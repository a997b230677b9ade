"""Launch-bound inference pays no boxed call: every op of a zoo model's eval forward
and of its ``generate()``, greedy or not, has an unboxed kernel on relay.

A boxed call costs several times an unboxed one's host time, and a decode loop makes
its calls once per token: one op left to the boxed fallback (generate()'s stopping
check, beam search's index split, a sampling filter's sort) shows in every token.
The random draws (multinomial) run unboxed too; out= ops are the boxed fallback's. Where
relay's memory is not on the fallback's target, every call is boxed: it copies the
tensors there.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import zoo
from zoo_runner import run_inference

import torch_fallback
import torch_fallback.relay
from torch_fallback.testing.calls import assert_served_as_placed

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")

DECODERS = [entry.name for entry in zoo.ZOO if entry.generates and entry.inputs == "text"]
# generate()'s other strategies, as users configure them. The sampling ones draw from the
# target's generator: eager CPU's numbers only where the target is the CPU.
SAMPLING = {"sampling", "min-p and typical"}
STRATEGIES: dict[str, dict[str, Any]] = {
    "sampling": {"do_sample": True, "top_k": 20, "top_p": 0.9, "temperature": 0.7},
    "min-p and typical": {"do_sample": True, "min_p": 0.05, "typical_p": 0.9},
    "beam search": {"num_beams": 3, "do_sample": False, "length_penalty": 0.8},
    "penalties": {"do_sample": False, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2},
}


def _param(name: str) -> object:
    return pytest.param(name, id=name, marks=() if name in zoo.CORE else pytest.mark.slow)


@pytest.mark.parametrize("name", [_param(entry.name) for entry in zoo.ZOO])
def test_inference_makes_no_boxed_call_where_relay_memory_is_on_the_target(name, placement):
    model, case = zoo.make_case(name, 0)
    model.to("relay")
    torch_fallback.reset_metrics()
    run_inference(name, model, case, "relay")
    assert_served_as_placed(placement.target == placement.home, f"{name} ({placement})")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("name", [_param(name) for name in DECODERS])
def test_every_decoding_strategy_gives_eagers_ids_and_makes_no_boxed_call(
    name, strategy, placement
):
    def generate(device: str) -> torch.Tensor:
        model, case = zoo.make_case(name, 0)  # the same weights each time
        model.to(device).eval()
        prompt = {key: value.to(device) for key, value in case["prompt"].items()}
        torch.manual_seed(0)
        torch_fallback.reset_metrics()
        with torch.inference_mode():  # as serving code decodes
            return model.generate(
                **prompt, max_new_tokens=zoo.NEW_TOKENS, min_new_tokens=zoo.NEW_TOKENS,
                **STRATEGIES[strategy],
            )  # fmt: skip

    expected = generate("cpu")
    ids = generate("relay")
    assert ids.device.type == "relay"
    if strategy not in SAMPLING or placement.target == "cpu":
        assert torch.equal(ids.cpu(), expected), f"{ids.tolist()} != {expected.tolist()}"
    assert_served_as_placed(placement.target == placement.home, f"{name}, {strategy} ({placement})")
