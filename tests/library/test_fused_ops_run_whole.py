"""Ops that eager runs as one fused kernel reach the fallback as one op.

A composite kernel serves any device without a kernel of its own, so on relay an
op such as _foreach_add_ (one kernel launch per list on CUDA) would become one
fallback call per tensor, and scaled_dot_product_attention would take the math
path (a dozen ops and their backwards) instead of the target's attention kernel.
Batch norm's composite picks cuDNN for CUDA tensors only. These tests check that
relay runs such ops whole on the target, with the kernels eager would choose,
and that the results are eager's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from checks import assert_fell_back, calls_on, served_unboxed
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_fallback
import torch_fallback.relay

pytestmark = pytest.mark.usefixtures("placement")

FUSED_ATTENTION = (
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_cudnn_attention",
)


def relay_copy(tensors):
    return [t.to("relay") for t in tensors]


def fallback_ops() -> dict[str, int]:
    return {name: m.calls for name, m in torch_fallback.metrics().items()}


def assert_all_close(actual, expected, **tolerance) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.device.type == "relay"
        torch.testing.assert_close(a.cpu(), e.cpu(), **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.complex64])
def test_foreach_ops_run_whole_one_call_per_list(placement, dtype):
    xs = [torch.randn(3, dtype=dtype), torch.randn(2, 2, dtype=dtype), torch.randn(5, dtype=dtype)]
    ys = [torch.randn(3, dtype=dtype), torch.randn(2, 2, dtype=dtype), torch.randn(5, dtype=dtype)]
    rx, ry = relay_copy(xs), relay_copy(ys)
    torch_fallback.reset_metrics()
    summed = torch._foreach_add(rx, ry, alpha=2.0)
    torch._foreach_mul_(rx, [0.5, 2.0, -1.0])  # in place, a scalar list
    torch._foreach_addcdiv_(rx, ry, summed, 0.25)
    calls = fallback_ops()
    assert calls == {
        "aten::_foreach_add.List": 1,
        "aten::_foreach_mul_.ScalarList": 1,
        "aten::_foreach_addcdiv_.Scalar": 1,
    }, f"expected one fallback call per _foreach_ op, saw {calls}"
    expected_sum = torch._foreach_add(xs, ys, alpha=2.0)
    torch._foreach_mul_(xs, [0.5, 2.0, -1.0])
    torch._foreach_addcdiv_(xs, ys, expected_sum, 0.25)
    assert_all_close(summed, expected_sum)
    assert_all_close(rx, xs)


def test_foreach_op_with_a_cpu_scalar_tensor(placement):
    xs = [torch.randn(4), torch.randn(2, 3)]
    rx = relay_copy(xs)
    step = torch.tensor(3.0)  # on the CPU, as optimizers keep their step counts
    torch._foreach_mul_(rx, step)
    torch._foreach_mul_(xs, step)
    assert_all_close(rx, xs)
    assert_fell_back("aten::_foreach_mul_.Tensor", placement.target)


@pytest.mark.parametrize("optimizer", ["AdamW", "Adam", "SGD"])
def test_foreach_optimizer_steps_match_eager_with_few_fallback_calls(placement, optimizer):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).double()
    relay_model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)).double().to("relay")
    relay_model.load_state_dict(model.state_dict())
    make = getattr(torch.optim, optimizer)
    kwargs = {"lr": 0.1, "foreach": True} | ({"momentum": 0.9} if optimizer == "SGD" else {})
    inputs = torch.randn(5, 6, dtype=torch.double)
    for net, device in ((model, "cpu"), (relay_model, "relay")):
        opt = make(net.parameters(), **kwargs)
        for step in range(3):
            opt.zero_grad()
            net(inputs.to(device)).square().sum().backward()
            if step == 2 and device == "relay":
                torch_fallback.reset_metrics()
            opt.step()
    calls = fallback_ops()
    per_tensor = {name for name in calls if not name.startswith("aten::_foreach_")}
    assert not per_tensor, f"the {optimizer} step ran per-tensor ops through the fallback: {calls}"
    assert_all_close(list(relay_model.parameters()), list(model.parameters()))


def attention_inputs(dtype: torch.dtype, head_dim: int = 32):
    torch.manual_seed(0)
    return [torch.randn(2, 4, 16, head_dim, dtype=dtype, requires_grad=True) for _ in range(3)]


def run_attention(q, k, v, causal: bool):
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    return [out, *grads]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_attention_runs_the_targets_fused_kernel(placement, causal):
    dtype = torch.float32
    q, k, v = attention_inputs(dtype)
    relay_inputs = [t.detach().to("relay").requires_grad_() for t in (q, k, v)]
    torch_fallback.reset_metrics()
    fused = run_attention(*relay_inputs, causal)
    calls = fallback_ops()
    used = [name for name in FUSED_ATTENTION if name in calls]
    assert used, f"scaled_dot_product_attention did not take a fused kernel on relay: {calls}"
    assert "aten::bmm" not in calls and "aten::_softmax" not in calls, calls
    # Where relay's memory is on the target, the choice and the kernels run unboxed.
    attention = {
        name: m
        for name, m in torch_fallback.metrics().items()
        if "_sdp" in name or "attention" in name
    }
    # The CPU's chooser reads metadata and is called directly; CUDA's sees the target's
    # tensors, through the fallback.
    chosen_on_target = placement.target == "cuda"
    assert ("aten::_fused_sdp_choice" in attention) == chosen_on_target, attention
    assert len(attention) >= 2 + chosen_on_target, attention
    boxed = {name: m.calls - m.calls_unboxed for name, m in attention.items()}
    all_unboxed = not any(boxed.values())
    assert all_unboxed == served_unboxed(placement), boxed
    # The math path, on relay (as before) and in eager on the CPU, is the reference.
    with sdpa_kernel(SDPBackend.MATH):
        torch_fallback.reset_metrics()
        math = run_attention(*relay_inputs, causal)
        assert not any(name in fallback_ops() for name in FUSED_ATTENTION)
        eager = run_attention(q, k, v, causal)
    tolerance = {"rtol": 1e-4, "atol": 1e-4}
    assert_all_close(fused, [m.detach() for m in math], **tolerance)
    assert_all_close(fused, eager, **tolerance)


FLASH = (
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_flash_attention_backward",
)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_half_precision_attention_runs_the_flash_kernel_eager_runs(placement, dtype, causal):
    """In half precision the target chooses flash attention, which PyTorch runs for
    CUDA tensors only (the CPU's flash kernel for any other device's): on a CUDA target
    relay reaches CUDA's kernel through the overrideable attention, not the math path."""
    q, k, v = attention_inputs(dtype)
    relay_inputs = [t.detach().to("relay").requires_grad_() for t in (q, k, v)]
    torch_fallback.reset_metrics()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # where cuDNN's would come first
        out, *grads = run_attention(*relay_inputs, causal)
    calls = fallback_ops()
    assert "aten::bmm" not in calls and "aten::_softmax" not in calls, calls
    if placement.target == "cuda":
        assert all(name in calls for name in FLASH), calls
        # The same kernels on CUDA copies, called directly: no CUDA autograd in this
        # process (pytorch/pytorch#161129). The forward is the same computation.
        cq, ck, cv = (t.detach().cuda() for t in (q, k, v))
        forward = torch.ops.aten._scaled_dot_product_flash_attention(cq, ck, cv, 0.0, causal)
        assert torch.equal(out.detach().cpu(), forward[0].cpu())
        grad_out = (2 * out.detach()).cpu().cuda()  # of out.square().sum()
        backward = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad_out, cq, ck, cv, *forward[:6], 0.0, causal, *forward[6:8]
        )
        assert_all_close(grads, backward, rtol=1e-3, atol=1e-3)
    else:
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" in calls, calls
    # Float32 math on the CPU as the reference, to half precision's accuracy.
    reference = run_attention(*(t.detach().float().requires_grad_() for t in (q, k, v)), causal)
    for got, expected in zip([out, *grads], reference, strict=True):
        torch.testing.assert_close(got.detach().float().cpu(), expected, rtol=2e-2, atol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_choice_for_a_head_dim_eager_pads_runs_the_math_path(placement, dtype):
    """CUDA's flash branch pads a head dimension that is not a multiple of 8 before
    its kernel runs; the overrideable attention runs the kernel on the tensors as
    they are, so there the CUDA target takes the math path: eager's values, no error."""
    q, k, v = attention_inputs(dtype, head_dim=12)
    relay_inputs = [t.detach().to("relay").requires_grad_() for t in (q, k, v)]
    torch_fallback.reset_metrics()
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out, *grads = run_attention(*relay_inputs, causal=True)
    calls = fallback_ops()
    if placement.target == "cuda":
        assert not any(name in calls for name in FLASH), calls
        assert "aten::_fused_sdp_choice" in calls, calls
    else:  # the CPU's flash kernel takes any head dimension
        assert "aten::_scaled_dot_product_flash_attention_for_cpu" in calls, calls
    assert out.shape == (2, 4, 16, 12) and out.dtype == dtype
    reference = run_attention(*(t.detach().float().requires_grad_() for t in (q, k, v)), True)
    for got, expected in zip([out, *grads], reference, strict=True):
        torch.testing.assert_close(got.detach().float().cpu(), expected, rtol=2e-2, atol=3e-2)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attention_dropout_draws_what_eager_cuda_draws(placement, dtype):
    if placement.target != "cuda":
        pytest.skip("CUDA's flash kernel runs on the CUDA target")
    q, k, v = (t.detach() for t in attention_inputs(dtype))
    relay_inputs = relay_copy([q, k, v])
    torch.manual_seed(7)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        got = F.scaled_dot_product_attention(*relay_inputs, dropout_p=0.3)
    torch.manual_seed(7)
    cuda_inputs = [t.cuda() for t in (q, k, v)]
    expected = torch.ops.aten._scaled_dot_product_flash_attention(*cuda_inputs, 0.3)[0]
    assert torch.equal(got.cpu(), expected.cpu())


def test_the_overrideable_attention_takes_no_mask():
    q = torch.randn(1, 2, 4, 8, device="relay")
    with pytest.raises(RuntimeError, match="takes no attention mask"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
            q, q, q, torch.zeros(4, 4, device="relay")
        )


def test_attention_with_a_boolean_mask_matches_eager(placement):
    q, k, v = attention_inputs(torch.float32)
    mask = torch.rand(16, 16) > 0.3
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    relay_inputs = relay_copy([q.detach(), k.detach(), v.detach()])
    got = F.scaled_dot_product_attention(*relay_inputs, attn_mask=mask.to("relay"))
    torch.testing.assert_close(got.cpu(), expected.detach(), rtol=1e-4, atol=1e-4)


def batch_norm_by_kernel(cudnn: bool, x, weight, bias, mean, var, grad):
    """Forward (output, saved mean and inverse std, running statistics) and backward
    (gradients of input, weight, bias) of training-mode batch norm, called kernel by
    kernel without autograd: cuDNN's or the native one."""
    mean, var = mean.clone(), var.clone()
    if cudnn:
        out, saved_mean, saved_invstd, reserve = torch.ops.aten.cudnn_batch_norm(
            x, weight, bias, mean, var, True, 0.1, 1e-5
        )
        grads = torch.ops.aten.cudnn_batch_norm_backward(
            x, grad, weight, mean, var, saved_mean, saved_invstd, 1e-5, reserve
        )
    else:
        out, saved_mean, saved_invstd = torch.ops.aten.native_batch_norm(
            x, weight, bias, mean, var, True, 0.1, 1e-5
        )
        grads = torch.ops.aten.native_batch_norm_backward(
            grad, x, weight, mean, var, saved_mean, saved_invstd, True, 1e-5, [True] * 3
        )
    return [out, mean, var, *grads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("cudnn_enabled", [True, False], ids=["cudnn-on", "cudnn-off"])
def test_batch_norm_runs_the_kernels_eager_would(placement, cudnn_enabled, dtype):
    """Bit for bit: cuDNN's kernels where the target is a GPU and PyTorch would choose
    cuDNN there (whatever relay's home: the boxed fallback and the unboxed kernel make
    eager CUDA's choice), the target's native kernels everywhere else."""
    torch.manual_seed(0)
    x, grad = torch.randn(8, 16, 12, 12, dtype=dtype), torch.randn(8, 16, 12, 12, dtype=dtype)
    weight, bias = torch.rand(16, dtype=dtype) + 0.5, torch.randn(16, dtype=dtype)
    mean, var = torch.randn(16, dtype=dtype), torch.rand(16, dtype=dtype) + 0.5
    target = placement.target
    uses_cudnn = cudnn_enabled and target == "cuda"
    with torch.backends.cudnn.flags(enabled=cudnn_enabled):
        expected = batch_norm_by_kernel(
            uses_cudnn, *(t.to(target) for t in (x, weight, bias, mean, var, grad))
        )
        if target == "cuda":  # the check can tell the two kernels apart
            other = batch_norm_by_kernel(
                not uses_cudnn, *(t.cuda() for t in (x, weight, bias, mean, var, grad))
            )
            assert not all(torch.equal(a, b) for a, b in zip(expected, other, strict=True))
        rx, rweight, rbias = (t.to("relay").requires_grad_() for t in (x, weight, bias))
        rmean, rvar = mean.to("relay"), var.to("relay")
        out = F.batch_norm(rx, rmean, rvar, rweight, rbias, training=True, eps=1e-5)
        out.backward(grad.to("relay"))
    actual = [out, rmean, rvar, rx.grad, rweight.grad, rbias.grad]
    names = ["output", "running mean", "running var", "input grad", "weight grad", "bias grad"]
    for name, a, e in zip(names, actual, expected, strict=True):
        assert torch.equal(a.cpu(), e.cpu()), f"{name} differs from the {target} kernel's"


def batch_norm_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    x = torch.randn(4, 8, 6, 6, dtype=dtype)
    weight, bias = torch.rand(8, dtype=dtype) + 0.5, torch.randn(8, dtype=dtype)
    mean, var = torch.randn(8, dtype=dtype), torch.rand(8, dtype=dtype) + 0.5
    return x, weight, bias, mean, var


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_batch_norm_without_autograd_runs_eagers_composite_on_the_target(
    placement, training, dtype
):
    """Where autograd records nothing (inference, frozen statistics), F.batch_norm's
    composite runs whole on the target as eager runs it there: cuDNN's one inference
    kernel on a GPU (impl index 1), not native_batch_norm's three. Where relay's memory
    is elsewhere, the composite runs on relay's tensors (native_batch_norm). Either way
    the results, the running statistics it updates included, are eager's on the target."""
    args = batch_norm_inputs(dtype)
    on_target = [t.to(placement.target) for t in args]
    on_relay = [t.to("relay") for t in args]
    call = torch.ops.aten._batch_norm_impl_index
    with torch.no_grad():
        expected = call(*on_target, training, 0.1, 1e-5, True)
        actual = call(*on_relay, training, 0.1, 1e-5, True)
    compared = [*actual[:3], *on_relay[3:]], [*expected[:3], *on_target[3:]]
    if not served_unboxed(placement):
        compared = [actual[0], *on_relay[3:]], [expected[0], *on_target[3:]]
    for a, e in zip(*compared, strict=True):
        assert a.device.type == "relay" and a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a.cpu(), e.cpu())
    op = "aten::_batch_norm_impl_index"
    if served_unboxed(placement):
        assert actual[4] == expected[4], "another kernel than eager's on the target"
        assert torch_fallback.metrics()[op].calls_unboxed == 1
        assert calls_on("aten::native_batch_norm", placement.target) == 0
    else:
        assert calls_on("aten::native_batch_norm", placement.target) == 1


def test_batch_norm_that_autograd_records_keeps_native_batch_norms_gradients(placement):
    """With a tensor that requires grad (or a forward-mode tangent), batch norm goes
    through native_batch_norm, whose derivatives autograd knows, on relay's tensors."""
    x, weight, bias, mean, var = batch_norm_inputs()
    relay_x = x.to("relay").requires_grad_()
    out = F.batch_norm(relay_x, mean.to("relay"), var.to("relay"), weight.to("relay"),
                       bias.to("relay"), training=False)  # fmt: skip
    assert out.grad_fn is not None
    out.sum().backward()
    expected = (weight / (var + 1e-5).sqrt()).view(1, 8, 1, 1).expand_as(x)
    torch.testing.assert_close(relay_x.grad.cpu(), expected)
    assert calls_on("aten::native_batch_norm", placement.target) == 1

    tangent = torch.randn_like(x)
    relay_args = [t.to("relay") for t in (mean, var, weight, bias)]
    with torch.autograd.forward_ad.dual_level(), torch.no_grad():
        dual = torch.autograd.forward_ad.make_dual(x.to("relay"), tangent.to("relay"))
        out = F.batch_norm(dual, *relay_args, training=False)
        jvp = torch.autograd.forward_ad.unpack_dual(out).tangent
    assert jvp is not None
    torch.testing.assert_close(jvp.cpu(), tangent * expected)


@pytest.mark.parametrize("training", [True, False], ids=["training", "eval"])
def test_native_batch_norm_returns_what_eager_returns(placement, training):
    """Called directly, native_batch_norm gives eager's three results, their shapes
    included: cuDNN leaves the saved statistics empty in eval mode, eager does not."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5)
    weight, bias = torch.rand(3) + 0.5, torch.randn(3)
    mean, var = torch.randn(3), torch.rand(3) + 0.5
    args = (x, weight, bias, mean, var)
    expected = torch.ops.aten.native_batch_norm(
        *(t.to(placement.target) for t in args), training, 0.1, 1e-5
    )
    actual = torch.ops.aten.native_batch_norm(*(t.to("relay") for t in args), training, 0.1, 1e-5)
    for a, e in zip(actual, expected, strict=True):
        assert a.device.type == "relay" and a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a.cpu(), e.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_an_op_with_its_own_kernel_and_an_implicit_composite_runs_the_kernel(placement, dtype):
    # mish_backward has CPU and CUDA kernels and a composite that other devices
    # take, which rounds otherwise: relay runs the target's kernel, as eager.
    torch.manual_seed(0)
    x, grad = torch.randn(64, dtype=dtype), torch.randn(64, dtype=dtype)
    dev = "cuda" if placement.target == "cuda" else "cpu"
    expected = torch.ops.aten.mish_backward(grad.to(dev), x.to(dev))
    torch_fallback.reset_metrics()
    actual = torch.ops.aten.mish_backward(grad.to("relay"), x.to("relay"))
    assert fallback_ops() == {"aten::mish_backward": 1}
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0)
    leaf = x.to("relay").requires_grad_()
    F.mish(leaf).backward(grad.to("relay"))
    torch.testing.assert_close(leaf.grad.cpu(), expected.cpu(), rtol=0, atol=0)
