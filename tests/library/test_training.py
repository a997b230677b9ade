"""Real models trained on relay against eager on the fallback's target device.

Each model is built once on the CPU with a fixed seed; relay trains a deep copy
in this process, the eager reference trains the same initial state on the
target device in a process that never imports torch_fallback (see
reference_runner). float64, three optimizer steps; compared: the loss of every
step, every parameter, every buffer (BatchNorm running statistics included) and
the eval-mode outputs.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from reference_runner import OPTIMIZERS, STEPS, make_case, run_reference, train

import torch_fallback.relay  # noqa: F401  (registers the relay device)

RTOL = 1e-7
ATOL = 1e-9

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning"),
]


def assert_matches(got: dict, expected: dict, placement) -> None:
    where = f"relay ({placement}) against eager on {placement.target}"
    assert got["devices"] == ["relay"], f"{where}: model tensors left relay: {got['devices']}"
    assert len(got["losses"]) == len(expected["losses"]) == STEPS
    mismatches: list[str] = []

    def check(what: str, actual: torch.Tensor, reference: torch.Tensor) -> None:
        try:
            torch.testing.assert_close(actual, reference, rtol=RTOL, atol=ATOL)
        except AssertionError as error:
            mismatches.append(f"{what}: {str(error).strip().splitlines()[0]} {_diff(error)}")

    for step, (loss, reference) in enumerate(zip(got["losses"], expected["losses"], strict=True)):
        check(f"loss of step {step + 1}", loss, reference)
    for kind in ("parameters", "buffers", "eval"):
        assert got[kind].keys() == expected[kind].keys(), (kind, where)
        for name, reference in expected[kind].items():
            check(f"{kind} {name}", got[kind][name], reference)
    assert not mismatches, f"{where}, {len(mismatches)} mismatches:\n" + "\n".join(mismatches)


def _diff(error: AssertionError) -> str:
    lines = [line.strip() for line in str(error).splitlines() if "difference" in line]
    return "(" + "; ".join(lines) + ")" if lines else ""


def train_both(name: str, placement, tmp_path) -> tuple[dict, dict]:
    model, inputs = make_case(name)
    got = train(name, copy.deepcopy(model), inputs, "relay")
    expected = run_reference(name, copy.deepcopy(model), inputs, placement.target, tmp_path)
    return got, expected


def test_cnn_with_batchnorm(placement, tmp_path):
    got, expected = train_both("cnn", placement, tmp_path)
    # Three training steps must have moved the running statistics.
    assert expected["buffers"]["bn1.num_batches_tracked"].item() == STEPS
    assert not torch.equal(expected["buffers"]["bn2.running_var"], torch.ones(16).double())
    assert_matches(got, expected, placement)


def test_lstm_gru_and_their_cells(placement, tmp_path):
    got, expected = train_both("recurrent", placement, tmp_path)
    assert_matches(got, expected, placement)


def test_transformer_encoder_train_then_eval_fast_path_with_padding_mask(placement, tmp_path):
    got, expected = train_both("transformer", placement, tmp_path)
    # Eager took the nested-tensor fast path: it leaves padded positions exactly zero.
    padded = expected["eval"]["encoder(mask)"][1, 3:]
    assert torch.count_nonzero(padded) == 0, "the eager eval did not take the fast path"
    assert_matches(got, expected, placement)


def test_embedding_bag(placement, tmp_path):
    got, expected = train_both("embedding_bag", placement, tmp_path)
    assert_matches(got, expected, placement)


def test_embedding_bag_sparse_gradients_match_or_are_refused_clearly(placement, tmp_path):
    """Sparse gradients either train like eager or are refused by an error naming the fallback."""
    model, inputs = make_case("embedding_bag_sparse")
    try:
        got = train("embedding_bag_sparse", copy.deepcopy(model), inputs, "relay")
    except (RuntimeError, NotImplementedError) as error:
        # A refusal is allowed if it names the fallback and leaves relay usable.
        assert "torch_fallback" in str(error), f"sparse gradients failed unclearly: {error}"
        x = torch.arange(4.0, device="relay")
        assert (x * 2).sum().item() == 12.0
        return
    expected = run_reference(
        "embedding_bag_sparse", copy.deepcopy(model), inputs, placement.target, tmp_path
    )
    assert_matches(got, expected, placement)
    assert all(math.isfinite(loss.item()) for loss in got["losses"])


def test_decoder_with_group_norm_transposed_conv_and_upsampling(placement, tmp_path):
    got, expected = train_both("decoder", placement, tmp_path)
    assert_matches(got, expected, placement)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_optimizers_foreach_and_fused(optimizer, placement, tmp_path):
    """Each optimizer's foreach or fused path (and gradient clipping) steps as eager does."""
    got, expected = train_both(f"mlp-{optimizer}", placement, tmp_path)
    assert_matches(got, expected, placement)
