"""Ops tinydev has no kernel for, run by torch-fallback and compared with CPU eager."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch.testing import assert_close

import tinydev  # noqa: F401  (registers the device)
import torch_fallback

TARGETS = [
    pytest.param("cpu", id="target-cpu"),
    pytest.param("cuda", id="target-cuda", marks=pytest.mark.requires_cuda),
]


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[str]:
    """The fallback's target for the test; metrics start empty."""
    with torch_fallback.target(request.param):
        torch_fallback.reset_metrics()
        yield request.param


def on_tinydev(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to("tinydev").requires_grad_(tensor.requires_grad)


def matches_cpu(fn: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> torch.Tensor:
    """fn on tinydev copies of inputs returns what it returns on the CPU."""
    expected = fn(*inputs)
    actual = fn(*(on_tinydev(tensor) for tensor in inputs))
    assert actual.device.type == "tinydev"
    assert_close(actual.cpu(), expected)
    return actual


def calls(op: str, target: str) -> int:
    snapshot = torch_fallback.metrics()
    assert op in snapshot, f"{op} did not reach the fallback; it saw {sorted(snapshot)}"
    counted = snapshot[op]
    return counted.calls_cuda if target == "cuda" else counted.calls_cpu


def test_elementwise(target):
    a, b = torch.randn(4, 5), torch.randn(4, 5)
    matches_cpu(lambda x, y: x + y * 2, a, b)
    matches_cpu(lambda x, y: torch.where(x > 0, torch.sin(x), y.exp()), a, b)
    assert calls("aten::add.Tensor", target) == 1
    assert calls("aten::sin", target) == 1


def test_reductions(target):
    a = torch.randn(6, 7)
    matches_cpu(lambda x: x.sum(), a)
    matches_cpu(lambda x: x.mean(dim=1), a)
    matches_cpu(lambda x: x.amax(dim=0), a)
    matches_cpu(lambda x: x.argmax(dim=1), a)
    assert calls("aten::sum.dim_IntList", target) == 1  # x.sum() decomposes to it


def test_matmul(target):
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    matches_cpu(torch.matmul, a, b)
    assert calls("aten::mm", target) == 1


def test_in_place_on_a_tensor_and_on_a_view(target):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    expected = a.clone()
    expected.add_(b)
    expected[1:].zero_()
    actual = on_tinydev(a)
    storage = actual.untyped_storage().data_ptr()
    actual.add_(on_tinydev(b))
    actual[1:].zero_()
    assert actual.untyped_storage().data_ptr() == storage  # in place, in tinydev's memory
    assert_close(actual.cpu(), expected)
    assert calls("aten::add_.Tensor", target) == 1
    assert calls("aten::zero_", target) == 1


def test_out_argument_is_resized_and_written(target):
    a, b = torch.randn(5), torch.randn(5)
    out = torch.empty(0, device="tinydev")
    torch.add(a.to("tinydev"), b.to("tinydev"), alpha=3, out=out)
    assert out.device.type == "tinydev"
    assert_close(out.cpu(), torch.add(a, b, alpha=3))
    assert calls("aten::add.out", target) == 1


def test_indexing(target):
    a = torch.randn(6, 4)
    index = torch.tensor([4, 0, 2])
    matches_cpu(lambda x: x[index.to(x.device)], a)
    matches_cpu(lambda x: x[x > 0], a)
    matches_cpu(lambda x: x[1:5:2, -1], a)

    expected = a.clone()
    expected[index] = 1.5
    actual = on_tinydev(a)
    actual[index.to("tinydev")] = 1.5
    assert_close(actual.cpu(), expected)


def test_linear_forward_and_backward(target):
    torch.manual_seed(0)
    reference = torch.nn.Linear(8, 3)
    model = torch.nn.Linear(8, 3).to("tinydev")
    model.load_state_dict(reference.state_dict())
    inputs = torch.randn(5, 8)

    expected = reference(inputs).relu().sum()
    expected.backward()
    actual = model(inputs.to("tinydev")).relu().sum()
    actual.backward()

    assert_close(actual.cpu(), expected)
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None and parameter.grad.device.type == "tinydev", name
        assert_close(parameter.grad.cpu(), dict(reference.named_parameters())[name].grad)
    assert sum(calls(op, target) for op in torch_fallback.metrics()) > 0
