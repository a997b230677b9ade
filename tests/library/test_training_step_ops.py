"""The functional ops a training step calls most run unboxed (DirectKernel).

Where all of a call's tensors live on the fallback target, the target kernel
runs on views of them without boxing; any other call goes to the boxed
fallback. Both must give eager's results, errors and metrics.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from checks import (
    assert_same,
    assert_unboxed_where_served,
    calls_on,
    run_both,
    served_unboxed,
    unboxed_calls,
)
from torch.utils._python_dispatch import TorchDispatchMode

import torch_fallback
import torch_fallback.relay
from torch_fallback.testing.calls import assert_served_as_placed

pytestmark = pytest.mark.usefixtures("placement")

DIRECT_OPS = [
    "aten::add.Tensor", "aten::sub.Tensor", "aten::mul.Tensor", "aten::div.Tensor", "aten::mm",
    "aten::bmm", "aten::addmm", "aten::_convolution", "aten::convolution_backward", "aten::relu",
    "aten::threshold_backward", "aten::gelu", "aten::gelu_backward", "aten::_softmax",
    "aten::_softmax_backward_data", "aten::_log_softmax", "aten::_log_softmax_backward_data",
    "aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::sum.dim_IntList",
    "aten::mean.dim", "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::cat",
    "aten::native_batch_norm", "aten::native_batch_norm_backward",
]  # fmt: skip

aten = torch.ops.aten


def batch_norm(training: bool):
    """native_batch_norm's output and the running statistics it writes in place
    (the saved statistics of eval mode differ between CPU and CUDA kernels)."""

    def call(on):
        x, weight, bias = on(torch.randn(4, 3, 5, 5)), on(torch.rand(3) + 0.5), on(torch.randn(3))
        mean, var = on(torch.randn(3)), on(torch.rand(3) + 0.5)
        out, saved_mean, saved_invstd = aten.native_batch_norm(
            x, weight, bias, mean, var, training, 0.1, 1e-5
        )
        return (out, saved_mean, saved_invstd, mean, var) if training else (out, mean, var)

    return call


def cat_with_itself(x):
    return torch.cat([x, x.t()], 1)


def batch_norm_backward(on):
    x, grad, weight = on(torch.randn(4, 3, 5, 5)), on(torch.randn(4, 3, 5, 5)), on(torch.rand(3))
    mean, var = on(torch.randn(3)), on(torch.rand(3) + 0.5)
    saved_mean, saved_invstd = x.mean((0, 2, 3)), x.var((0, 2, 3)).add(1e-5).rsqrt()
    return aten.native_batch_norm_backward(
        grad, x, weight, mean, var, saved_mean, saved_invstd, True, 1e-5, [True, True, False]
    )


# (name, call): each call takes a function that puts a CPU tensor where the op runs.
CALLS = [
    (
        "add",
        lambda on: torch.add(on(torch.randn(4, 6))[:, 1:5], on(torch.randn(4, 4)).t(), alpha=2),
    ),
    ("sub", lambda on: torch.sub(on(torch.randn(3, 1)), on(torch.randn(1, 5)))),
    (
        "mul complex conj",
        lambda on: torch.mul(
            on(torch.randn(4, dtype=torch.cfloat)).conj(), on(torch.randn(4, dtype=torch.cfloat))
        ),
    ),
    ("div int", lambda on: torch.div(on(torch.arange(1, 9)), on(torch.tensor([3] * 8)))),
    ("mm", lambda on: torch.mm(on(torch.randn(5, 3)), on(torch.randn(4, 3)).t())),
    ("bmm", lambda on: torch.bmm(on(torch.randn(2, 3, 4)), on(torch.randn(2, 4, 2)))),
    (
        "addmm",
        lambda on: torch.addmm(on(torch.randn(3)), on(torch.randn(2, 4)), on(torch.randn(4, 3))),
    ),
    (
        "conv",
        lambda on: F.conv2d(
            on(torch.randn(1, 2, 5, 5)),
            on(torch.randn(4, 1, 3, 3)),
            on(torch.randn(4)),
            stride=2,
            padding=1,
            groups=2,
        ),
    ),
    (
        "conv backward",
        lambda on: aten.convolution_backward(
            on(torch.randn(1, 4, 3, 3)),
            on(torch.randn(1, 2, 5, 5)),
            on(torch.randn(4, 2, 3, 3)),
            [4],
            [2, 2],
            [1, 1],
            [1, 1],
            False,
            [0, 0],
            1,
            [False, True, True],
        ),
    ),
    ("relu", lambda on: torch.relu(on(torch.randn(7))[::2])),
    (
        "threshold_backward",
        lambda on: aten.threshold_backward(on(torch.randn(6)), on(torch.randn(6)), 0.5),
    ),
    ("gelu", lambda on: F.gelu(on(torch.randn(6)), approximate="tanh")),
    ("gelu_backward", lambda on: aten.gelu_backward(on(torch.randn(6)), on(torch.randn(6)))),
    ("softmax", lambda on: torch.softmax(on(torch.randn(3, 5)), 1)),
    ("softmax half to float", lambda on: aten._softmax(on(torch.randn(3, 5)), 0, False)),
    (
        "softmax backward",
        lambda on: aten._softmax_backward_data(
            on(torch.randn(3, 5)), on(torch.randn(3, 5)), 1, torch.float32
        ),
    ),
    ("log_softmax", lambda on: F.log_softmax(on(torch.randn(3, 5, dtype=torch.float64)), 0)),
    (
        "log_softmax backward",
        lambda on: aten._log_softmax_backward_data(
            on(torch.randn(3, 5)), on(torch.randn(3, 5)), 1, torch.float32
        ),
    ),
    (
        "layer_norm",
        lambda on: aten.native_layer_norm(
            on(torch.randn(2, 3, 4)), [4], on(torch.randn(4)), None, 1e-5
        ),
    ),
    (
        "layer_norm backward",
        lambda on: aten.native_layer_norm_backward(
            on(torch.randn(2, 4)),
            on(torch.randn(2, 4)),
            [4],
            on(torch.randn(2, 1)),
            on(torch.rand(2, 1) + 1),
            on(torch.randn(4)),
            None,
            [True, True, False],
        ),
    ),
    ("sum dim dtype", lambda on: torch.sum(on(torch.randn(3, 4)), (0,), dtype=torch.float64)),
    ("sum no dim", lambda on: torch.sum(on(torch.randn(3, 4)), dim=None, keepdim=True)),
    ("mean", lambda on: torch.mean(on(torch.randn(3, 4)), -1, keepdim=True)),
    (
        "nll_loss",
        lambda on: aten.nll_loss_forward(
            on(torch.randn(4, 3)), on(torch.tensor([0, 2, 1, 2])), None, 1, 1
        ),
    ),
    (
        "nll_loss weight",
        lambda on: F.nll_loss(
            on(torch.randn(4, 3)), on(torch.tensor([0, 2, 1, 2])), on(torch.rand(3))
        ),
    ),
    (
        "nll_loss backward",
        lambda on: aten.nll_loss_backward(
            on(torch.tensor(1.0)),
            on(torch.randn(4, 3)),
            on(torch.tensor([0, 2, 1, 2])),
            None,
            1,
            -100,
            on(torch.tensor(4.0)),
        ),
    ),
    ("empty", lambda on: torch.add(on(torch.randn(0, 3)), on(torch.randn(1, 3)))),
    ("cat", lambda on: torch.cat([on(torch.randn(2, 3)), on(torch.randn(4, 6))[:, ::2]])),
    (
        "cat dim 1 promoting",
        lambda on: torch.cat([on(torch.randn(2, 3)), on(torch.arange(4).reshape(2, 2))], 1),
    ),
    ("cat legacy empty", lambda on: torch.cat([on(torch.randn(0)), on(torch.randn(2, 3))])),
    ("batch_norm training", batch_norm(training=True)),
    ("batch_norm eval", batch_norm(training=False)),
    ("batch_norm backward", batch_norm_backward),
    ("cat one tensor twice", lambda on: cat_with_itself(on(torch.randn(3, 3)))),
]


def test_the_hot_ops_have_unboxed_kernels_on_relay():
    missing = [
        op
        for op in DIRECT_OPS
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")
    ]
    assert not missing, f"no PrivateUse1 kernel for {missing}"


@pytest.mark.parametrize("name, call", CALLS, ids=[name for name, _ in CALLS])
def test_direct_op_matches_eager_and_is_counted(placement, name, call):
    before = sum(calls_on(op, placement.target) for op in DIRECT_OPS)
    actual, expected = run_both(call)
    assert_same(actual, expected)
    assert sum(calls_on(op, placement.target) for op in DIRECT_OPS) > before
    # Elsewhere the boxed fallback copies the tensors to the target and back.
    assert (unboxed_calls() > 0) == served_unboxed(placement)


def test_results_do_not_alias_their_inputs(placement):
    x = torch.randn(5).to("relay")
    y = torch.relu(x)
    y.add_(100)
    assert x.cpu().max() < 100
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def assert_a_relay_tensor_like_any_other(result: torch.Tensor, like: torch.Tensor) -> None:
    # A kernel's fresh result may become the relay tensor itself: nothing of the
    # CPU or CUDA tensor it was may remain.
    assert result.device == like.device and result.untyped_storage().device == like.device
    assert not result.is_cpu and not result.is_cuda
    # Compared as text: older PyTorch's DispatchKeySet has no __eq__.
    assert str(torch._C._dispatch_keys(result)) == str(torch._C._dispatch_keys(like))
    assert result.untyped_storage().nbytes() >= result.numel() * result.element_size()


@pytest.mark.parametrize("mode", ["grad", "inference_mode"])
def test_results_are_relay_tensors_like_any_other(placement, mode):
    x, w = torch.randn(4, 3).to("relay"), torch.randn(5, 3).to("relay")
    # Inference tensors have no autograd keys: a result made in inference mode
    # gets the keys of a relay tensor made there.
    with torch.inference_mode(mode == "inference_mode"):
        fresh = torch.empty(1, device="relay")
        results = [torch.relu(x), x.t() * 2, torch.mm(x, w.t()), torch.cumsum(x, 0)]  # last: boxed
        results += list(torch.ops.aten.native_layer_norm(x, [3], None, None, 1e-5))
        results += [torch.argmax(x, 1), x.to(torch.float64)]  # an int64 result (boxed); a copy
    for result in results:
        assert_a_relay_tensor_like_any_other(result, fresh)
    if mode == "inference_mode":
        return
    version = results[0]._version
    results[0].add_(1)
    assert results[0]._version == version + 1
    # Autograd builds its graph on the adopted result.
    leaf = torch.randn(4, 3).to("relay").requires_grad_()
    (leaf * leaf).sum().backward()
    assert_a_relay_tensor_like_any_other(leaf.grad, fresh)
    assert torch.equal(leaf.grad.cpu(), 2 * leaf.detach().cpu())


def test_a_cpu_scalar_tensor_among_the_arguments(placement):
    # A 0-dim CPU tensor (a Python number) stays on the CPU, as eager CUDA takes it.
    actual, expected = run_both(lambda on: torch.mul(on(torch.randn(3, 2)), torch.tensor(2.5)))
    assert_same(actual, expected)
    actual, expected = run_both(lambda on: on(torch.randn(3, 2)) * 0.5 + 1)
    assert_same(actual, expected)
    assert calls_on("aten::mul.Tensor", placement.target) == 2
    assert (unboxed_calls() == 3) == served_unboxed(placement)


def test_a_cpu_tensor_of_more_than_one_element_is_refused_as_eager_refuses_it(placement):
    with pytest.raises(RuntimeError, match="must be on relay"):
        torch.mul(torch.randn(3).to("relay"), torch.randn(3))
    assert unboxed_calls() == 0


def test_a_quantized_dtype_is_refused_clearly(placement):
    with pytest.raises(NotImplementedError, match="quantized"):
        torch.sum(torch.randn(3).to("relay"), (0,), dtype=torch.qint8)


def test_an_error_of_the_target_kernel_names_the_op_and_the_target(placement):
    a, b = torch.randn(2, 3).to("relay"), torch.randn(2, 3).to("relay")
    message = f"raised by aten::mm on the {placement.target} fallback target"
    with pytest.raises(RuntimeError, match=message):
        torch.mm(a, b)
    assert torch_fallback.metrics()["aten::mm"].errors == 1


def test_inference_mode_and_a_dispatch_mode(placement):
    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(4, 3), torch.randn(5, 3)
    with torch.inference_mode():
        assert_same(F.linear(x.to("relay"), w.to("relay")), F.linear(x, w))
    assert (unboxed_calls() > 0) == served_unboxed(placement)
    with Seen() as seen:
        actual = torch.mm(x.to("relay"), w.to("relay").t())
    assert "aten.mm.default" in seen.ops
    assert_same(actual, x @ w.t())


def test_settings_that_send_an_op_elsewhere(placement):
    torch_fallback.set_cpu_ops(["aten::mm"])
    actual, expected = run_both(lambda on: torch.mm(on(torch.randn(2, 3)), on(torch.randn(3, 2))))
    assert_same(actual, expected)
    assert calls_on("aten::mm", "cpu") == 1
    # On the CPU op list the op runs on the CPU: unboxed only where relay's memory is.
    assert torch_fallback.metrics()["aten::mm"].calls_unboxed == int(placement.home == "cpu")
    torch_fallback.set_cpu_ops([])
    torch_fallback.set_cuda_sync("device")
    actual, expected = run_both(lambda on: torch.mm(on(torch.randn(2, 3)), on(torch.randn(3, 2))))
    assert_same(actual, expected)


def test_a_training_step_through_the_unboxed_kernels(placement):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.LayerNorm(64), torch.nn.Linear(64, 5), torch.nn.GELU(),
    ).double()  # fmt: skip
    on_relay = copy.deepcopy(model).to("relay")
    x, y = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.tensor([1, 3])
    for net, inputs, target in ((model, x, y), (on_relay, x.to("relay"), y.to("relay"))):
        F.cross_entropy(net(inputs), target).backward()
    for expected, actual in zip(model.parameters(), on_relay.parameters(), strict=True):
        torch.testing.assert_close(actual.grad.cpu(), expected.grad)
    assert (unboxed_calls() > 0) == served_unboxed(placement)


def losses_and_their_backward(on):
    x = on(torch.randn(4, 5)).requires_grad_()
    target = on(torch.randn(4, 5))
    loss = (
        F.mse_loss(x, target) + F.smooth_l1_loss(x, target) + F.l1_loss(x, target)
        + F.binary_cross_entropy_with_logits(x, target.sigmoid()) + x.exp().reciprocal().sum()
        + F.logsigmoid(x).mean()
    )  # fmt: skip
    return loss.detach(), *torch.autograd.grad(loss, x)


def clipped_gradients(on):
    shapes = [(3, 4), (5,), (2, 2, 2)]
    params = [on(torch.zeros(shape)).requires_grad_() for shape in shapes]
    for param in params:
        param.grad = on(torch.randn(param.shape))
    total = torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
    return total, torch.linalg.vector_norm(params[0].grad), *[param.grad for param in params]


def amsgrad_maxima(on):
    kept, new = (
        [on(torch.randn(3)), on(torch.randn(2, 2))],
        [on(torch.randn(3)), on(torch.randn(2, 2))],
    )
    torch._foreach_maximum_(kept, new)
    return kept


# (name, ops it must count unboxed where relay's memory is on the target, call)
LOSS_AND_OPTIMIZER_CALLS = [
    ("losses", ["aten::mse_loss", "aten::mse_loss_backward", "aten::smooth_l1_loss",
                "aten::log_sigmoid_forward", "aten::log_sigmoid_backward", "aten::sgn",
                "aten::reciprocal"], losses_and_their_backward),
    ("clip_grad_norm_", ["aten::_foreach_norm.Scalar", "aten::linalg_vector_norm",
                         "aten::_foreach_mul_.Tensor"], clipped_gradients),
    ("amsgrad", ["aten::_foreach_maximum_.List"], amsgrad_maxima),
]  # fmt: skip


@pytest.mark.parametrize(
    "name, ops, call",
    LOSS_AND_OPTIMIZER_CALLS,
    ids=[name for name, _, _ in LOSS_AND_OPTIMIZER_CALLS],
)
def test_loss_and_optimizer_op_matches_eager_unboxed_where_relay_memory_is(
    placement, name, ops, call
):
    actual, expected = run_both(call)
    assert_same(actual, expected)
    assert_unboxed_where_served(ops, placement)


MODELS = {
    "mlp": lambda: torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
    ),
    "cnn": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 4),
    ),
    "transformer": lambda: torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(12, 2, 24, dropout=0.0, batch_first=True),
        torch.nn.Linear(12, 4),
    ),
}
INPUTS = {"mlp": (6, 12), "cnn": (2, 3, 4, 4), "transformer": (2, 3, 12)}
OPTIMIZERS = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2),
    "amsgrad": lambda params: torch.optim.Adam(params, lr=1e-2, amsgrad=True),
    "sgd-nesterov": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9, nesterov=True),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_training_loop_makes_no_boxed_call_where_relay_memory_is(placement, model, optimizer):
    # The loop users write: several losses, clip_grad_norm_, an optimizer and a schedule,
    # an accuracy read with item(). Each boxed call would pay its host time every step.
    def train(on):
        torch.manual_seed(0)
        net = MODELS[model]().double()
        net.to(on(torch.empty(0)).device)
        opt = OPTIMIZERS[optimizer](net.parameters())
        schedule = torch.optim.lr_scheduler.OneCycleLR(opt, 0.05, total_steps=4)
        losses = []
        for _ in range(3):
            x = on(torch.randn(*INPUTS[model], dtype=torch.float64))
            out = net(x)
            out = out.reshape(-1, out.shape[-1])
            y = on(torch.randint(0, 4, out.shape[:1]))
            loss = F.cross_entropy(out, y) + F.mse_loss(out, torch.zeros_like(out))
            loss = loss + F.smooth_l1_loss(out, torch.ones_like(out)) + F.l1_loss(out, 0 * out)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            schedule.step()
            losses.append(loss.detach())
            (out.argmax(-1) == y).double().mean().item()
        return losses, list(net.parameters())

    actual, expected = run_both(train)
    assert_same(actual, expected)
    # smooth_l1_loss's backward, for one, is an out= op: boxed, and not counted.
    assert_served_as_placed(served_unboxed(placement), f"{model} with {optimizer}")
