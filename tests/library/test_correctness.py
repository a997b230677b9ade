"""Regression tests: the fallback gives eager's answer or eager's error, never a third thing.

Each test runs for every placement (fallback target x relay home) and compares
with eager PyTorch on the target device. The defects they pin down returned
silently wrong values or crashed the process.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_fallback

pytestmark = pytest.mark.usefixtures("placement")

OVERLAP = "refer to a single memory location"


def on(device: str, tensor: torch.Tensor) -> torch.Tensor:
    """A copy on `device` (never the tensor itself, so eager and relay start alike)."""
    return tensor.to(device, copy=True)


def reference_device(placement) -> str:
    return "cuda" if placement.target == "cuda" else "cpu"


# Arguments that kernels write although their schemas do not say so.


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_running_statistics_are_written_back(placement, training):
    torch.manual_seed(0)
    x = torch.randn(8, 3, 5, dtype=torch.float64)
    mean, var = torch.randn(3, dtype=torch.float64), torch.rand(3, dtype=torch.float64) + 0.5
    expected = [on(reference_device(placement), t) for t in (x, mean, var)]
    actual = [on("relay", t) for t in (x, mean, var)]
    out_expected = F.batch_norm(expected[0], expected[1], expected[2], training=training)
    out_actual = F.batch_norm(actual[0], actual[1], actual[2], training=training)
    torch.testing.assert_close(out_actual.cpu(), out_expected.cpu())
    torch.testing.assert_close(actual[1].cpu(), expected[1].cpu(), msg="running_mean")
    torch.testing.assert_close(actual[2].cpu(), expected[2].cpu(), msg="running_var")
    if training:
        assert not torch.equal(actual[1].cpu(), mean), "running_mean was not updated at all"


def test_instance_norm_running_statistics_are_written_back(placement):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    stats = (torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    expected = [on(reference_device(placement), t) for t in stats]
    actual = [on("relay", t) for t in stats]
    F.instance_norm(on(reference_device(placement), x), *expected, use_input_stats=True)
    F.instance_norm(on("relay", x), *actual, use_input_stats=True)
    for name, a, e in zip(("running_mean", "running_var"), actual, expected, strict=True):
        torch.testing.assert_close(a.cpu(), e.cpu(), msg=name)


# Arguments that alias each other.


def test_overlapping_copy_is_refused_as_in_eager(placement):
    x = torch.arange(6.0, device="relay")
    with pytest.raises(RuntimeError, match=OVERLAP):
        x[1:] = x[:-1]
    torch.testing.assert_close(x.cpu(), torch.arange(6.0))
    m = torch.arange(9.0).reshape(3, 3).to("relay")
    with pytest.raises(RuntimeError, match=OVERLAP):
        m.t().copy_(m)
    torch.testing.assert_close(m.cpu(), torch.arange(9.0).reshape(3, 3))


def test_copy_to_itself_and_disjoint_slices_work(placement):
    x = torch.arange(6.0, device="relay")
    x.copy_(x)
    x[:3] = x[3:]
    torch.testing.assert_close(x.cpu(), torch.tensor([3.0, 4.0, 5.0, 3.0, 4.0, 5.0]))


def test_overlapping_in_place_op_is_refused_as_in_eager(placement):
    x = torch.arange(6.0, device="relay")
    with pytest.raises(RuntimeError, match=OVERLAP):
        x[1:].add_(x[:-1])
    torch.testing.assert_close(x.cpu(), torch.arange(6.0))


def test_arguments_sharing_memory_share_it_on_the_target(placement):
    """One storage seen through several arguments is one storage to the kernel."""
    base = torch.arange(12.0)
    expected = on(reference_device(placement), base)
    actual = on("relay", base)
    for x in (expected, actual):
        x.mul_(x)  # self and other are one tensor
        torch.add(x[:6], x[6:], out=x[6:])  # out= aliases an input exactly
        x[::2].mul_(x[1::2])  # interleaved views of one storage
    torch.testing.assert_close(actual.cpu(), expected.cpu())


# In-place ops never resize their input.


@pytest.mark.parametrize(
    "method", ["logical_and_", "logical_or_", "logical_xor_", "ldexp_", "add_", "mul_"]
)
# relay allocates the memory of a copy; it takes over the memory of an op's result.
@pytest.mark.parametrize("made_by", ["copy", "op"])
def test_in_place_op_with_a_broadcast_self_raises_as_in_eager(placement, method, made_by):
    a = torch.ones(5, 1)
    b = torch.ones(5, 5)
    with pytest.raises(RuntimeError) as eager:
        getattr(on(reference_device(placement), a), method)(on(reference_device(placement), b))
    relay_a = on("relay", a) if made_by == "copy" else on("relay", a) * 1
    with pytest.raises(RuntimeError) as error:
        getattr(relay_a, method)(on("relay", b))
    assert relay_a.shape == (5, 1)
    assert torch.equal(relay_a.cpu(), a)
    assert "doesn't match the broadcast shape" in str(eager.value)
    assert "broadcast shape" in str(error.value) or "never resizes" in str(error.value)


def test_in_place_op_whose_kernel_would_resize_self_is_refused_clearly(placement):
    """Eager's addbmm_ resizes a broadcastable self to the result's shape; relay
    refuses to change its tensor's shape, says so, and leaves it as it was."""
    batch1, batch2 = torch.ones(5, 5, 4), torch.ones(5, 4, 10)
    for made_by in ("copy", "op"):
        a = on("relay", torch.ones(1)) if made_by == "copy" else on("relay", torch.ones(1)) * 1
        with pytest.raises(RuntimeError, match=r"addbmm_ .*never resizes its input"):
            a.addbmm_(on("relay", batch1), on("relay", batch2))
        assert a.shape == (1,) and a.cpu().item() == 1.0


def test_addr_on_a_0_dim_self_raises_as_in_eager(placement):
    v = torch.ones(3)
    with pytest.raises(RuntimeError, match="2D tensor expected"):
        torch.tensor(1.0, device=reference_device(placement)).addr_(
            on(reference_device(placement), v), on(reference_device(placement), v)
        )
    a = torch.tensor(1.0, device="relay")
    with pytest.raises(RuntimeError, match=r"2D tensor expected|never resizes"):
        a.addr_(on("relay", v), on("relay", v))
    assert a.shape == ()


# Lazy conjugation set by a kernel on its output.


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_lu_solve_complex_matches_eager(placement, left, dtype):
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=dtype)
    b = torch.randn(3, 2, dtype=dtype) if left else torch.randn(2, 3, dtype=dtype)
    lu, pivots = torch.linalg.lu_factor(a)
    dev = reference_device(placement)
    expected = torch.linalg.lu_solve(on(dev, lu), on(dev, pivots), on(dev, b), left=left)
    actual = torch.linalg.lu_solve(on("relay", lu), on("relay", pivots), on("relay", b), left=left)
    torch.testing.assert_close(actual.cpu(), expected.cpu())


def test_conj_physical_in_place_matches_eager(placement):
    z = torch.randn(5, dtype=torch.complex64)
    relay_z = on("relay", z)
    relay_z.conj_physical_()
    torch.testing.assert_close(relay_z.cpu(), z.conj_physical())


# Results a relay tensor cannot hold are refused before the op runs.


def test_quantize_is_refused_clearly(placement):
    x = torch.randn(4, device="relay")
    with pytest.raises(NotImplementedError, match="torch_fallback: aten::quantize_per_tensor"):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
    torch_fallback.reset_metrics()


@pytest.mark.parametrize(
    "make_sparse",
    [
        lambda x: x.to_sparse(),
        lambda x: x.to_sparse_csr(),
        lambda x: torch.empty(2, 2, device="relay", layout=torch.sparse_coo),
    ],
    ids=["to_sparse", "to_sparse_csr", "empty-sparse-layout"],
)
def test_sparse_results_are_refused_clearly(placement, make_sparse):
    x = torch.ones(2, 2, device="relay")
    with pytest.raises((NotImplementedError, RuntimeError), match=r"torch_fallback|relay"):
        make_sparse(x)


def test_nested_tensors_from_a_mask_work(placement):
    torch.manual_seed(0)
    x = torch.randn(2, 4, 3)
    mask = torch.tensor([[True, True, False, False], [True, True, True, False]])
    dev = reference_device(placement)
    expected = torch._nested_tensor_from_mask(on(dev, x), on(dev, mask), mask_check=False)
    actual = torch._nested_tensor_from_mask(on("relay", x), on("relay", mask), mask_check=False)
    assert actual.is_nested and actual.device.type == "relay"
    padded = actual.to_padded_tensor(0.0, (2, 4, 3))
    assert padded.device.type == "relay"
    torch.testing.assert_close(padded.cpu(), expected.to_padded_tensor(0.0, (2, 4, 3)).cpu())


def test_transformer_encoder_eval_fast_path_with_padding_mask(placement):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
    dev = reference_device(placement)
    with torch.no_grad():
        expected = encoder.to(dev)(on(dev, x), src_key_padding_mask=on(dev, mask))
        actual = encoder.to("relay")(on("relay", x), src_key_padding_mask=on("relay", mask))
    assert actual.device.type == "relay"
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=1e-4, atol=1e-5)


# CPU tensors among the device's: what CUDA's kernels take, and what they refuse.


def test_bernoulli_takes_its_probabilities_from_the_cpu_as_cuda_does(placement):
    p = torch.rand(4, 5)
    dev = reference_device(placement)
    torch.manual_seed(3)
    expected = torch.empty(4, 5, device=dev).bernoulli_(p)
    torch.manual_seed(3)
    actual = torch.empty(4, 5, device="relay").bernoulli_(p)
    assert actual.device.type == "relay"
    torch.testing.assert_close(actual.cpu(), expected.cpu())


@pytest.mark.parametrize(
    "call",
    [
        lambda x, mask: torch.masked_select(x, mask),
        lambda x, mask: x.masked_fill_(mask, 0.0),
        lambda x, mask: torch.where(mask, x, x),
        lambda x, mask: x.index_select(0, torch.tensor([0, 2])),
        lambda x, mask: torch.lerp(x, x, torch.rand(4, 5)),
    ],
    ids=["masked_select", "masked_fill_", "where", "index_select", "lerp"],
)
def test_a_cpu_tensor_cuda_refuses_is_refused(placement, call):
    x, mask = torch.randn(4, 5), torch.rand(4, 5) > 0.5
    with pytest.raises(RuntimeError, match="on cpu"):
        call(x.to("relay"), mask)


# Zero tensors (autograd's placeholders for known-zero gradients).


def test_efficient_zero_tensor_materializes(placement):
    z = torch._efficientzerotensor((4, 4), device="relay")
    torch.testing.assert_close(z.cpu(), torch.zeros(4, 4))


def test_sgn_backward_gives_zero_gradients(placement):
    x = torch.randn(5, device="relay", requires_grad=True)
    (grad,) = torch.autograd.grad(torch.sgn(x).sum(), [x])
    torch.testing.assert_close(grad.cpu(), torch.zeros(5))


# Ops the target has no kernel for.


@pytest.mark.parametrize("cell_type", [torch.nn.LSTMCell, torch.nn.GRUCell])
def test_recurrent_cells_forward_and_backward_match_eager(placement, cell_type):
    torch.manual_seed(0)
    cell = cell_type(4, 6).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    # The reference runs on the CPU in float64: a process with relay registered
    # cannot run native CUDA autograd (pytorch/pytorch#161129).
    dev = "cpu"
    results = {}
    for device in (dev, "relay"):
        moved = cell_type(4, 6).double().to(device)
        moved.load_state_dict(cell.state_dict())
        inp = x.to(device).requires_grad_()
        out = moved(inp)
        hidden = out[0] if isinstance(out, tuple) else out
        loss = hidden.pow(2).sum() + (out[1].sum() if isinstance(out, tuple) else 0)
        grads = torch.autograd.grad(loss, [inp, *moved.parameters()])
        results[device] = [hidden.detach().cpu(), *(g.cpu() for g in grads)]
    for a, e in zip(results["relay"], results[dev], strict=True):
        torch.testing.assert_close(a, e)


def fused_cell_calls(dtype):
    """The fused cell ops nn.LSTM and nn.GRU call on non-CPU tensors, forward and
    backward, on relay arguments of `dtype` (name, op, arguments, the results to compare)."""
    torch.manual_seed(0)
    batch, hidden = 5, 8

    def t(*shape):
        return torch.randn(*shape).to(dtype).to("relay")

    lstm_gates = t(batch, 4 * hidden), t(batch, 4 * hidden)
    lstm_biases = t(4 * hidden), t(4 * hidden)
    gru_gates, gru_biases = (t(batch, 3 * hidden),) * 2, (t(3 * hidden),) * 2
    cx, hx, grad = t(batch, hidden), t(batch, hidden), t(batch, hidden)
    aten = torch.ops.aten
    _, cy, lstm_workspace = aten._thnn_fused_lstm_cell(*lstm_gates, cx, *lstm_biases)
    _, gru_workspace = aten._thnn_fused_gru_cell(*gru_gates, hx, *gru_biases)
    return [
        ("lstm", aten._thnn_fused_lstm_cell, (*lstm_gates, cx, *lstm_biases), 3),
        ("gru", aten._thnn_fused_gru_cell, (*gru_gates, hx, *gru_biases), 2),
        # The bias gradients are sums of the rounded gate gradients (left out).
        ("lstm backward", aten._thnn_fused_lstm_cell_backward_impl,
         (grad, grad, cx, cy, lstm_workspace, True), 2),
        ("gru backward", aten._thnn_fused_gru_cell_backward, (grad, gru_workspace, True), 3),
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fused_recurrent_cells_round_only_what_they_store(placement, dtype):
    # CUDA's fused cells compute in float for half and bfloat16 and round their
    # results once: in half precision they equal the float computation rounded.
    for name, op, args, compared in fused_cell_calls(dtype):
        in_float = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
        actual = op(*args)[:compared]
        expected = [r.to(dtype) for r in op(*in_float)[:compared]]
        for a, e in zip(actual, expected, strict=True):
            assert a.dtype == dtype, name
            torch.testing.assert_close(a.cpu(), e.cpu(), rtol=0, atol=0, msg=name)


def test_op_without_a_kernel_on_the_target_names_it(placement):
    if placement.target != "cpu":
        pytest.skip("the CPU target is the one without CUDA-only kernels")
    # CUDA-only, and torch-fallback has no CPU decomposition for it.
    with pytest.raises(NotImplementedError, match=r"has no CPU kernel .* no decomposition"):
        torch.ops.aten._cudnn_init_dropout_state(0.5, True, 0, dtype=torch.uint8, device="relay")


# Where each output lives.


@pytest.mark.requires_cuda
def test_outputs_the_target_keeps_on_the_cpu_stay_there(placement):
    if placement.target != "cuda":
        pytest.skip("only the CUDA kernel returns CPU outputs")
    q = torch.randn(1, 16, 2, 64)
    args = dict(
        bias=None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        dropout_p=0.5,
        custom_mask_type=0,
        compute_log_sumexp=True,
    )
    expected = torch.ops.aten._efficient_attention_forward(*(q.cuda(),) * 3, **args)
    actual = torch.ops.aten._efficient_attention_forward(*(q.to("relay"),) * 3, **args)
    for a, e in zip(actual, expected, strict=True):
        if isinstance(e, torch.Tensor):
            assert a.device.type == ("relay" if e.is_cuda else e.device.type), (a.device, e.device)
