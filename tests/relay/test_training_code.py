"""Training code that drives autograd and the optimizers beyond forward and backward.

Higher-order gradients, tensor hooks, functional calls, parametrizations, a
closure optimizer, TorchScript, anomaly detection and autograd's own checks,
each compared with eager CPU in float64 on every placement. The references stay
on the CPU: eager CUDA autograd misbehaves in a process with a PrivateUse1
backend (pytorch/pytorch#161129).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.usefixtures("placement")

f64 = torch.float64


def on_relay(module: nn.Module) -> nn.Module:
    return copy.deepcopy(module).to("relay")


def test_gradients_of_gradients_match_eager():
    def second_derivative(x: torch.Tensor) -> torch.Tensor:
        y = (x.sin() * x.pow(3)).sum()
        (first,) = torch.autograd.grad(y, x, create_graph=True)
        (second,) = torch.autograd.grad(first.sum(), x)
        return second

    x = torch.randn(7, dtype=f64)
    expected = second_derivative(x.clone().requires_grad_())
    got = second_derivative(x.to("relay").requires_grad_())
    assert got.device.type == "relay"
    torch.testing.assert_close(got.cpu(), expected)


def test_tensor_hooks_see_and_replace_relay_gradients():
    def run(device: str) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
        x = torch.linspace(-1, 1, 6, dtype=f64, device=device, requires_grad=True)
        hidden = x * 3
        hidden.retain_grad()
        seen: list[str] = []

        def double(grad: torch.Tensor) -> torch.Tensor:
            seen.append(grad.device.type)
            return grad * 2

        hidden.register_hook(double)
        (hidden.tanh() ** 2).sum().backward()
        return x.grad, hidden.grad, seen

    x_grad, hidden_grad, seen = run("relay")
    expected_x, expected_hidden, _ = run("cpu")
    assert seen == ["relay"]
    torch.testing.assert_close(x_grad.cpu(), expected_x)  # the hook's doubling reached x
    torch.testing.assert_close(hidden_grad.cpu(), expected_hidden)


def test_functional_call_with_replacement_parameters():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)).to(f64)
    replacement = {name: torch.randn_like(p) for name, p in module.named_parameters()}
    x = torch.randn(5, 4, dtype=f64)

    def loss(mod: nn.Module, params: dict, inputs: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(mod, params, (inputs,)).pow(2).sum()

    expected = torch.func.grad(lambda p: loss(module, p, x))(replacement)
    relay_params = {name: p.to("relay") for name, p in replacement.items()}
    got = torch.func.grad(lambda p: loss(on_relay(module), p, x.to("relay")))(relay_params)
    for name in expected:
        torch.testing.assert_close(got[name].cpu(), expected[name], msg=name)


def test_parametrized_weights_train_as_in_eager():
    torch.manual_seed(0)
    eager = nn.Linear(5, 5).to(f64)
    relay_module = on_relay(eager)
    for module in (eager, relay_module):
        nn.utils.parametrizations.orthogonal(module)
        nn.utils.parametrize.register_parametrization(module, "bias", nn.Tanh())
    x = torch.randn(3, 5, dtype=f64)
    for module, inputs in ((eager, x), (relay_module, x.to("relay"))):
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            module(inputs).sin().sum().backward()
            optimizer.step()
    torch.testing.assert_close(relay_module.weight.cpu(), eager.weight)
    torch.testing.assert_close(relay_module.bias.cpu(), eager.bias)
    assert relay_module.parametrizations.weight.original.device.type == "relay"


def test_closure_optimizer_lbfgs_matches_eager():
    torch.manual_seed(0)
    eager = nn.Linear(3, 1).to(f64)
    relay_module = on_relay(eager)
    x, y = torch.randn(16, 3, dtype=f64), torch.randn(16, 1, dtype=f64)
    for module, inputs, targets in ((eager, x, y), (relay_module, x.to("relay"), y.to("relay"))):
        optimizer = torch.optim.LBFGS(
            module.parameters(), max_iter=6, line_search_fn="strong_wolfe"
        )

        def closure(module=module, optimizer=optimizer, inputs=inputs, targets=targets):
            optimizer.zero_grad()
            loss = F.mse_loss(module(inputs), targets)
            loss.backward()
            return loss

        optimizer.step(closure)
    torch.testing.assert_close(relay_module.weight.cpu(), eager.weight)
    torch.testing.assert_close(relay_module.bias.cpu(), eager.bias)


def adam_reloaded_from_a_checkpoint(module: nn.Module) -> torch.optim.Adam:
    """An Adam optimizer after one step, saved with torch.save, loaded into a new one,
    which steps once more."""
    optimizer = torch.optim.Adam(module.parameters(), lr=0.1)
    module(torch.ones(2, 3, dtype=f64, device=module.weight.device)).sum().backward()
    optimizer.step()
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    reloaded = torch.optim.Adam(module.parameters(), lr=0.1)
    reloaded.load_state_dict(torch.load(buffer))
    reloaded.step()  # the reloaded state steps as the saved one did
    return reloaded


def test_optimizer_state_saved_and_loaded_stays_where_eager_keeps_it():
    torch.manual_seed(0)
    eager = nn.Linear(3, 3).to(f64)
    relay_module = on_relay(eager)
    adam_reloaded_from_a_checkpoint(eager)
    reloaded = adam_reloaded_from_a_checkpoint(relay_module)
    # The moments live with the parameters, the step count on the CPU, as for CUDA.
    state = reloaded.state[relay_module.weight]
    assert {name: value.device.type for name, value in state.items()} == {
        "step": "cpu",
        "exp_avg": "relay",
        "exp_avg_sq": "relay",
    }
    torch.testing.assert_close(relay_module.weight.cpu(), eager.weight)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_torchscript_functions_run_relay_tensors():
    @torch.jit.script
    def scripted(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * y + x.sum()

    x, y = torch.randn(4, dtype=f64), torch.randn(4, dtype=f64)
    got = scripted(x.to("relay"), y.to("relay"))
    assert got.device.type == "relay"
    torch.testing.assert_close(got.cpu(), scripted(x, y))


def test_anomaly_detection_names_a_nan_made_in_backward():
    x = torch.zeros(1, device="relay", requires_grad=True)
    with (
        torch.autograd.detect_anomaly(check_nan=True),
        pytest.warns(UserWarning, match="Traceback of forward call"),
        pytest.raises(RuntimeError, match="returned nan values"),
    ):
        (x / x).sum().backward()


def test_a_saved_tensor_written_in_place_fails_backward_as_in_eager():
    x = torch.randn(3, device="relay", requires_grad=True)
    saved = x.exp()  # exp saves its result for backward
    saved.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()
