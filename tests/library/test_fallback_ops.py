"""Ops without a relay kernel run through the fallback and match CPU eager.

Each test runs for every placement (fallback target x relay home); the CUDA
ones are marked requires_cuda. Each checks the metrics to prove the op went
through the fallback on the expected target.
"""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F
from checks import assert_fell_back, calls_on

import torch_fallback
import torch_fallback.relay

pytestmark = pytest.mark.usefixtures("placement")


def relay(tensor: torch.Tensor) -> torch.Tensor:
    moved = tensor.to("relay")
    assert moved.device.type == "relay"
    return moved


def assert_matches(actual, expected) -> None:
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected, strict=True):
            assert_matches(a, e)
        return
    assert actual.device.type == "relay", f"result on {actual.device}, expected relay"
    torch.testing.assert_close(actual.cpu(), expected)


# The six ops that upstream tested as found in torchbench.


def test_embedding_bag(placement):
    weight = torch.randn(50, 8)
    indices = torch.randint(0, 50, (40,))
    offsets = torch.tensor([0, 7, 20, 33])
    expected = F.embedding_bag(indices, weight, offsets, mode="mean")
    actual = F.embedding_bag(relay(indices), relay(weight), relay(offsets), mode="mean")
    assert_matches(actual, expected)
    ops = [op for op in torch_fallback.metrics() if "embedding_bag" in op]
    assert ops and all(calls_on(op, placement.target) for op in ops)


def test_unique(placement):
    x = torch.randint(0, 20, (300,))
    expected = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    actual = torch.unique(relay(x), sorted=True, return_inverse=True, return_counts=True)
    assert_matches(actual, expected)
    assert_fell_back("aten::_unique2", placement.target)


def test_repeat_interleave_with_tensor_repeats(placement):
    x = torch.randn(5, 3)
    repeats = torch.tensor([1, 0, 3, 2, 4])
    expected = torch.repeat_interleave(x, repeats, dim=0)
    actual = torch.repeat_interleave(relay(x), relay(repeats), dim=0)
    assert_matches(actual, expected)
    assert_fell_back("aten::repeat_interleave.Tensor", placement.target)


def test_grid_sampler_2d(placement):
    image = torch.randn(2, 3, 8, 8)
    grid = torch.rand(2, 5, 5, 2) * 2 - 1
    expected = F.grid_sample(image, grid, align_corners=False)
    actual = F.grid_sample(relay(image), relay(grid), align_corners=False)
    assert_matches(actual, expected)
    assert_fell_back("aten::grid_sampler_2d", placement.target)


def test_scatter_reduce_mean(placement):
    base = torch.randn(6)
    index = torch.tensor([0, 1, 0, 1, 2, 1, 5, 5])
    src = torch.randn(8)
    expected = base.scatter_reduce(0, index, src, reduce="mean", include_self=True)
    actual = relay(base).scatter_reduce(
        0, relay(index), relay(src), reduce="mean", include_self=True
    )
    assert_matches(actual, expected)
    assert_fell_back("aten::scatter_reduce.two", placement.target)


def test_nonzero(placement):
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, -1.0]])
    assert_matches(torch.nonzero(relay(x)), torch.nonzero(x))
    assert_fell_back("aten::nonzero", placement.target)


# Mutation: in-place ops, views, out= arguments.


def test_in_place_op_updates_the_relay_tensor(placement):
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    rx = relay(x)
    returned = rx.add_(relay(y), alpha=2)
    assert returned is rx
    assert_matches(rx, x + 2 * y)
    # A structured in-place op reaches the fallback as its out= variant.
    assert_fell_back("aten::add_.Tensor", placement.target)


def test_in_place_op_on_a_view_writes_through_to_the_base(placement):
    x = torch.arange(12.0).reshape(3, 4)
    rx = relay(x)
    rx[1:, ::2].mul_(-1)
    x[1:, ::2].mul_(-1)
    assert_matches(rx, x)
    assert_fell_back("aten::mul_.Tensor", placement.target)


def test_out_argument_of_the_right_size(placement):
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    out = relay(torch.empty(3, 5))
    returned = torch.mul(relay(a), relay(b), out=out)
    assert returned is out
    assert_matches(out, a * b)
    assert_fell_back("aten::mul.out", placement.target)


def test_out_argument_that_must_grow(placement):
    x = torch.tensor([0.0, 3.0, 0.0, 4.0, 5.0])
    out = relay(torch.empty(0, dtype=torch.long))
    returned = torch.nonzero(relay(x), out=out)
    assert returned is out
    assert_matches(out, torch.nonzero(x))
    assert_fell_back("aten::nonzero.out", placement.target)


def test_out_argument_takes_the_layout_the_kernel_gives_it(placement):
    # nonzero's kernels resize out= to (ndim, n) and transpose it, on the CPU and CUDA.
    x = torch.tensor([[1.0, 0, 2], [0, 3, 4]])
    expected = torch.empty(0, dtype=torch.long)
    torch.nonzero(x, out=expected)
    out = torch.empty(0, dtype=torch.long, device="relay")
    torch.nonzero(relay(x), out=out)
    assert_matches(out, expected)
    assert out.stride() == expected.stride()


@pytest.mark.parametrize("batch", [(), (2,)], ids=["matrix", "batched"])
def test_a_result_viewing_a_buffer_of_the_kernels_keeps_eagers_layout(placement, batch):
    # linalg_lstsq's solution is a slice of a column-major (max(m, n), k) buffer,
    # on the CPU and CUDA alike; its functional form writes through the out= one.
    a, b = torch.randn(*batch, 6, 3), torch.randn(*batch, 6, 2)
    expected = torch.linalg.lstsq(a, b).solution
    outs = [torch.empty(0, dtype=dtype, device="relay") for dtype in (a.dtype, a.dtype, torch.long)]
    outs.append(torch.empty(0, device="relay"))
    for actual in (
        torch.linalg.lstsq(relay(a), relay(b)).solution,
        torch.linalg.lstsq(relay(a), relay(b), out=tuple(outs)).solution,
    ):
        assert_matches(actual, expected)
        assert actual.stride() == expected.stride()
        assert actual.untyped_storage().nbytes() == expected.untyped_storage().nbytes()
    assert outs[0].stride() == expected.stride()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_sync_batchnorms_ops_compute_as_cudas_kernels(placement, dtype):
    # SyncBatchNorm's CUDA-only ops, against their definitions in float64: statistics in
    # float for half and bfloat16 (CUDA's accumulation type), results in the input's dtype.
    x = torch.randn(4, 3, 5, 5).to(dtype)
    stats_type = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if stats_type != dtype else {}
    exact, eps = x.double(), 1e-5
    mean, var = exact.mean((0, 2, 3)), exact.var((0, 2, 3), unbiased=False)
    invstd = (var + eps).rsqrt()

    # Statistics in float32 differ from float64's by float32 rounding.
    stats_tolerance = {} if stats_type == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}

    def check(actual, expected, dtype_expected, **tol):
        assert actual.device.type == "relay" and actual.dtype == dtype_expected
        torch.testing.assert_close(actual.cpu().double(), expected, **(tol or stats_tolerance))

    got_mean, got_invstd = torch.batch_norm_stats(relay(x), eps)
    check(got_mean, mean, stats_type)
    check(got_invstd, invstd, stats_type)

    # Two ranks' statistics (the halves of the batch), combined; running statistics updated.
    halves = [torch.batch_norm_stats(relay(half), eps) for half in x.chunk(2)]
    running_mean, running_var = (
        relay(torch.zeros(3, dtype=dtype)),
        relay(torch.ones(3, dtype=dtype)),
    )
    means, invstds = torch.stack([m for m, _ in halves]), torch.stack([i for _, i in halves])
    # Counts in the running statistics' dtype, as SyncBatchNorm gives them; CUDA's kernel
    # refuses another, and so does every target.
    other_type = torch.float64 if dtype == torch.float32 else torch.float32
    c10_name = {torch.float64: "Double", torch.float32: "Float", torch.bfloat16: "BFloat16"}
    expected_type = c10_name.get(dtype, "Half")
    with pytest.raises(RuntimeError, match=f"Expected counts to have type {expected_type} but"):
        torch.batch_norm_gather_stats_with_counts(
            relay(x), means, invstds, running_mean, running_var, 0.1, eps,
            relay(torch.tensor([50.0, 50.0], dtype=other_type)),
        )  # fmt: skip
    gathered = torch.batch_norm_gather_stats_with_counts(
        relay(x), means, invstds, running_mean, running_var, 0.1, eps,
        relay(torch.tensor([50.0, 50.0], dtype=dtype)),
    )  # fmt: skip
    check(gathered[0], mean, stats_type)
    check(gathered[1], invstd, stats_type)
    # Its sibling with one count for every rank makes its counts in that dtype.
    running_copies = relay(torch.zeros(3, dtype=dtype)), relay(torch.ones(3, dtype=dtype))
    same_counts = torch.batch_norm_gather_stats(
        relay(x), means, invstds, *running_copies, 0.1, eps, 50
    )
    for actual, expected in zip(same_counts, gathered, strict=True):
        torch.testing.assert_close(actual.cpu(), expected.cpu())
    torch.testing.assert_close(running_copies[1].cpu(), running_var.cpu())
    check(running_mean, 0.1 * mean, dtype, **tolerance)
    unbiased = exact.var((0, 2, 3), unbiased=True)
    check(running_var, 0.9 + 0.1 * unbiased, dtype, **tolerance)

    weight, bias = torch.randn(3).to(dtype), torch.randn(3).to(dtype)
    shaped = lambda t: t.view(1, 3, 1, 1)  # noqa: E731
    normalized = (exact - shaped(mean)) * shaped(invstd)
    out = torch.batch_norm_elemt(relay(x), relay(weight), relay(bias), got_mean, got_invstd, eps)
    check(out, normalized * shaped(weight.double()) + shaped(bias.double()), dtype, **tolerance)

    grad = torch.randn(4, 3, 5, 5).to(dtype)
    sum_dy, sum_dy_xmu, grad_weight, grad_bias = torch.batch_norm_backward_reduce(
        relay(grad), relay(x), got_mean, got_invstd, relay(weight), True, True, True
    )
    exact_grad = grad.double()
    expected_sum_dy = exact_grad.sum((0, 2, 3))
    xmu_terms = exact_grad * (exact - shaped(mean))
    expected_sum_dy_xmu = xmu_terms.sum((0, 2, 3))

    def sum_error(terms, scale=1.0):
        # CUDA's kernel sums half and bfloat16 terms in their own precision: up to an
        # epsilon of each term's size off.
        return torch.finfo(dtype).eps * (terms.abs().sum((0, 2, 3)) * scale).max().item()

    if stats_type == dtype:
        check(sum_dy, expected_sum_dy, stats_type, rtol=1e-4, atol=1e-4)
        check(sum_dy_xmu, expected_sum_dy_xmu, stats_type, rtol=1e-4, atol=1e-4)
        check(grad_weight, expected_sum_dy_xmu * invstd, dtype)
        check(grad_bias, expected_sum_dy, dtype)
    else:
        check(sum_dy, expected_sum_dy, stats_type, rtol=0.0, atol=sum_error(exact_grad))
        check(sum_dy_xmu, expected_sum_dy_xmu, stats_type, rtol=0.0, atol=sum_error(xmu_terms))
        weight_error = sum_error(xmu_terms, invstd) + 1e-2
        check(grad_weight, expected_sum_dy_xmu * invstd, dtype, rtol=1e-2, atol=weight_error)
        check(grad_bias, expected_sum_dy, dtype, rtol=1e-2, atol=sum_error(exact_grad) + 1e-2)

    grad_input = torch.batch_norm_backward_elemt(
        relay(grad), relay(x), got_mean, got_invstd, relay(weight).to(stats_type), sum_dy,
        sum_dy_xmu, relay(torch.tensor([50, 50], dtype=torch.int32)),
    )  # fmt: skip
    # BatchNorm's input gradient over the whole batch (100 values per channel).
    expected = (
        exact_grad - shaped(expected_sum_dy) / 100
        - (exact - shaped(mean)) * shaped(invstd**2 * expected_sum_dy_xmu / 100)
    ) * shaped(weight.double() * invstd)  # fmt: skip
    check(grad_input, expected, dtype, **(tolerance or {"rtol": 1e-4, "atol": 1e-4}))
    for op in ("batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce"):
        assert_fell_back(f"aten::{op}", placement.target)


def test_op_with_several_outputs_written_in_place(placement):
    x = torch.randn(4, 6)
    values, indices = relay(torch.empty(0)), relay(torch.empty(0, dtype=torch.long))
    torch.max(relay(x), dim=1, out=(values, indices))
    expected = torch.max(x, dim=1)
    assert_matches((values, indices), (expected.values, expected.indices))


# Lists and optional lists.


def test_foreach_op_on_two_tensor_lists(placement):
    # _foreach_* ops run whole on the target: two lists in, one list out.
    xs = [torch.randn(3), torch.randn(2, 2)]
    ys = [torch.randn(3), torch.randn(2, 2)]
    actual = torch._foreach_add([relay(x) for x in xs], [relay(y) for y in ys])
    assert_matches(actual, [x + y for x, y in zip(xs, ys, strict=True)])
    assert_fell_back("aten::_foreach_add.List", placement.target)


def test_op_mutating_several_tensor_lists(placement):
    # _fused_sgd_ has CPU and CUDA kernels only, so its three lists (two
    # mutated) and its optional tensors reach the fallback as one op.
    params = [torch.randn(4), torch.randn(2, 3)]
    grads = [torch.randn(4), torch.randn(2, 3)]
    momenta = [torch.randn(4), torch.randn(2, 3)]
    relay_lists = [[relay(t) for t in group] for group in (params, grads, momenta)]
    settings = dict(
        weight_decay=0.01,
        momentum=0.9,
        lr=0.1,
        dampening=0.0,
        nesterov=True,
        maximize=False,
        is_first_step=False,
    )
    torch._fused_sgd_(params, grads, momenta, **settings)
    torch._fused_sgd_(*relay_lists, **settings)
    assert_matches(relay_lists[0], params)
    assert_matches(relay_lists[2], momenta)
    assert_fell_back("aten::_fused_sgd_", placement.target)


def test_op_with_an_optional_tensor_list(placement):
    x = torch.randn(5, 4)
    rows, cols = torch.tensor([4, 0, 2]), torch.tensor([1, 3, 3])
    assert_matches(relay(x)[relay(rows), relay(cols)], x[rows, cols])
    assert_matches(relay(x)[:, relay(cols)], x[:, cols])  # a None in the list
    assert_fell_back("aten::index.Tensor", placement.target)


def test_in_place_op_with_an_optional_tensor_list(placement):
    x, values = torch.zeros(4, 3), torch.tensor([1.0, 2.0, 3.0])
    index = torch.tensor([3, 0, 3])
    rx = relay(x)
    rx.index_put_((relay(index),), relay(values).unsqueeze(1).expand(3, 3), accumulate=True)
    x.index_put_((index,), values.unsqueeze(1).expand(3, 3), accumulate=True)
    assert_matches(rx, x)
    assert_fell_back("aten::_index_put_impl_", placement.target)


# Devices, scalars, printing.


def test_factory_op_with_a_device_argument(placement):
    actual = torch.tril_indices(4, 3, offset=1, device="relay")
    assert actual.device == torch.device("relay", 0)
    assert_matches(actual, torch.tril_indices(4, 3, offset=1))
    assert_fell_back("aten::tril_indices", placement.target)


@pytest.mark.parametrize("periodic", [None, False, True])
def test_window_function_made_by_a_dispatch_stub(placement, periodic):
    # kaiser_window's composite kernels call a DispatchStub, which has no relay entry.
    args = (8,) if periodic is None else (8, periodic, 5.0)
    actual = torch.kaiser_window(*args, dtype=torch.float64, device="relay")
    assert_matches(actual, torch.kaiser_window(*args, dtype=torch.float64))
    signal = torch.randn(64, dtype=torch.float64)
    assert_matches(
        torch.stft(relay(signal), 8, window=actual, return_complex=True),
        torch.stft(
            signal, 8, window=torch.kaiser_window(*args, dtype=torch.float64), return_complex=True
        ),
    )


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64])
def test_histc_counts_integer_tensors_as_cuda_does(placement, dtype):
    # Hugging Face's MoE layers count expert indices with histc on any device
    # but the CPU; CUDA's kernel takes integers, the CPU's does not.
    x = torch.randint(0, 10, (200,), dtype=dtype)
    expected = torch.histc(x.double(), bins=5, min=0, max=9).to(dtype)
    assert_matches(torch.histc(relay(x), bins=5, min=0, max=9), expected)
    for out_dtype in (dtype, torch.float32):  # CUDA's out= form casts its counts
        out = torch.empty(0, dtype=out_dtype, device="relay")
        torch.histc(relay(x), bins=5, min=0, max=9, out=out)
        assert_matches(out, expected.to(out_dtype))


def test_scaled_dot_product_attention_under_vmap(placement):
    q, k = torch.randn(3, 2, 5, 8), torch.randn(3, 2, 5, 8)
    mask = torch.rand(3, 5, 5) > 0.3

    def attend(q, k, mask):
        return F.scaled_dot_product_attention(q, k, k, attn_mask=mask)

    assert_matches(
        torch.vmap(attend)(relay(q), relay(k), relay(mask)), torch.vmap(attend)(q, k, mask)
    )
    assert_matches(
        torch.vmap(attend, in_dims=(None, 0, None))(relay(q[0]), relay(k), relay(mask[0])),
        torch.vmap(attend, in_dims=(None, 0, None))(q[0], k, mask[0]),
    )


def test_traced_attention_records_the_kernel_eager_runs(placement):
    # torch.compile and make_fx trace relay's attention: the kernel choice must not
    # be a traced call (AOTAutograd cannot partition it), and on the CPU target the
    # trace runs CPU's flash kernel as eager relay and a CPU trace do.
    from functorch.compile import aot_function, make_boxed_func
    from torch.fx.experimental.proxy_tensor import make_fx

    def attend(q):
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    q = torch.randn(2, 2, 8, 16)
    graph = make_fx(attend, tracing_mode="fake")(relay(q))
    called = [str(node.target) for node in graph.graph.nodes if node.op == "call_function"]
    assert not any("_fused_sdp_choice" in name for name in called), called
    if placement.target == "cpu":
        assert any("flash_attention_for_cpu" in name for name in called), called
    compiled = aot_function(attend, fw_compiler=lambda gm, _: make_boxed_func(gm.forward))
    on_relay, on_cpu = relay(q).requires_grad_(), q.clone().requires_grad_()
    out = compiled(on_relay)
    out.sum().backward()
    expected = attend(on_cpu)
    expected.sum().backward()
    assert_matches(out.detach(), expected.detach())
    assert_matches(on_relay.grad, on_cpu.grad)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Conv2d(3, 4, 3, padding=1),
        lambda: torch.nn.ConvTranspose1d(3, 4, 3, stride=2),
        lambda: torch.nn.Sequential(torch.nn.Conv1d(3, 4, 3), torch.nn.ReLU(), torch.nn.LSTM(6, 5)),
    ],
    ids=["conv2d", "conv-transpose", "conv-and-lstm"],
)
def test_jit_trace_records_the_ops_relay_runs(placement, make):
    # The tracer leaves convolution unrecorded for the _convolution it calls:
    # that must be called on relay's tensors, not on the target's.
    torch.manual_seed(0)
    module = make().double().eval()
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    if isinstance(module, torch.nn.Conv2d):
        x = x.unsqueeze(-1).expand(2, 3, 8, 8).contiguous()
    expected = module(x)
    module.to("relay")
    traced = torch.jit.trace(module, (relay(x),), check_trace=False)
    kinds = [node.kind() for node in traced.inlined_graph.nodes()]
    assert any("convolution" in kind for kind in kinds), kinds
    other = torch.randn_like(x)
    assert_matches(traced(relay(x)), expected)
    assert_matches(traced(relay(other)), make_reference(module, other))


def make_reference(module, x):
    with torch.no_grad():
        return torch.jit.trace(module.cpu(), (x,), check_trace=False)(x)


def test_views_of_a_nested_tensor(placement):
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    nested = torch.nested.nested_tensor([relay(part) for part in parts])
    expected = torch.nested.nested_tensor(parts)
    views = [
        lambda t: t.unbind(),
        lambda t: t[1],
        lambda t: t.transpose(1, 2).unbind(),
        lambda t: t.unsqueeze(1).unbind(),
        lambda t: t.narrow(0, 1, 1).unbind(),
        lambda t: t.chunk(1, -1)[0].unbind(),
        lambda t: t.split_with_sizes([1, 2], -1)[1].unbind(),
        lambda t: t.detach().unbind(),
    ]
    for view in views:
        assert_matches(view(nested), view(expected))
    detached = nested.detach()
    assert detached.is_nested and detached._base is None
    nested.unbind()[1].mul_(0)  # a view writes the nested tensor's memory
    assert_matches(nested.unbind(), [parts[0], torch.zeros(4, 3)])
    assert_matches(detached.unbind(), [parts[0], torch.zeros(4, 3)])  # it shares that memory


def test_an_op_pytorch_serves_for_no_nested_tensor_says_so(placement):
    nested = torch.nested.nested_tensor([relay(torch.randn(2, 3)), relay(torch.randn(4, 3))])
    with pytest.raises(NotImplementedError) as eager:
        torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)]).mean(-1)
    with pytest.raises(NotImplementedError, match="for nested tensors") as error:
        nested.mean(-1)
    assert "NestedTensorCPU" in str(eager.value)
    if placement.target == "cuda":
        assert "no CPU kernel for it either" in str(error.value)
    elif torch.version.cuda is not None:  # a CUDA wheel knows CUDA has no kernel for it either
        assert "no CUDA kernel for it either" in str(error.value)


def nested(parts, **kwargs):
    return torch.nested.nested_tensor(parts, dtype=torch.float64, **kwargs)


def assert_nested_matches(actual, expected) -> None:
    assert actual.is_nested and actual.device.type == "relay"
    assert_matches(actual.unbind(), expected.unbind())


def test_nested_tensors_move_between_relay_and_the_cpu(placement):
    parts = [torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)]
    on_cpu = nested(parts, requires_grad=True)
    on_relay = on_cpu.to("relay")
    assert_nested_matches(on_relay, on_cpu)
    back = on_relay.to("cpu")
    assert back.device.type == "cpu" and back.is_nested
    torch.nested.to_padded_tensor(on_relay * 2, 0.0).sum().backward()
    assert_matches(
        [part.to("relay") for part in on_cpu.grad.unbind()], [torch.full_like(p, 2) for p in parts]
    )
    target = nested([torch.zeros(2, 3), torch.zeros(4, 3)], device="relay")
    target.copy_(on_cpu.detach())
    assert_nested_matches(target, on_cpu.detach())


def test_nested_tensors_survive_save_and_load(placement):
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    on_relay = torch.nested.nested_tensor(parts).to("relay")
    # Its sizes are metadata, on the CPU as CUDA's nested tensors keep them.
    assert on_relay._nested_tensor_size().device.type == "cpu"
    saved = io.BytesIO()
    torch.save(on_relay, saved)
    for map_location in [None, "relay"]:
        saved.seek(0)
        loaded = torch.load(saved, map_location=map_location, weights_only=True)
        assert_nested_matches(loaded, torch.nested.nested_tensor(parts))
    saved.seek(0)
    assert torch.load(saved, map_location="cpu").device.type == "cpu"


def test_attention_on_jagged_nested_tensors(placement):
    # Its math path views the buffer as a strided nested tensor (_nested_view_from_buffer).
    parts = [torch.randn(3, 2, 8, dtype=torch.float64), torch.randn(5, 2, 8, dtype=torch.float64)]

    def attend(device):
        q = torch.nested.nested_tensor([p.to(device) for p in parts], layout=torch.jagged)
        q = q.transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q).unbind()

    assert_matches(attend("relay"), attend("cpu"))


def test_ops_on_two_different_nested_tensors(placement):
    # Each nested argument's buffer is its own on the target.
    a_parts = [torch.randn(2, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)]
    b_parts = [torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)]
    a, b = nested(a_parts), nested(b_parts)
    ra, rb = a.to("relay"), b.to("relay")
    assert_nested_matches(torch.bmm(ra, rb), torch.bmm(a, b))
    assert_nested_matches(ra + ra * 2, a + a * 2)


def test_matmul_and_linear_on_nested_tensors_train(placement):
    # Their composite kernels cannot take nested tensors; the target's nested kernels run.
    def run(device):
        # Leaves on the device: a gradient through .to() of a transposed nested
        # tensor fails in PyTorch's _to_copy_nested on any device.
        torch.manual_seed(0)
        made = [[torch.randn(2, 3, 4), torch.randn(2, 5, 4)] for _ in range(2)]
        q, k = (nested(parts, device=device, requires_grad=True) for parts in made)
        x = nested([torch.randn(3, 4), torch.randn(5, 4)], device=device, requires_grad=True)
        weight = torch.randn(6, 4, dtype=torch.float64).to(device).requires_grad_()
        scores = torch.matmul(q, k.transpose(-2, -1))
        projected = torch.nn.functional.linear(x, weight)
        loss = torch.nested.to_padded_tensor(scores, 0.0).sum()
        loss = loss + torch.nested.to_padded_tensor(projected, 0.0).pow(2).sum()
        loss.backward()
        return scores, projected, q.grad, k.grad, x.grad, weight.grad

    actual, expected = run("relay"), run("cpu")
    for got, want in zip(actual, expected, strict=True):
        if want.is_nested:
            assert_nested_matches(got, want)
        else:
            assert_matches(got, want)


def test_zero_dim_cpu_tensor_is_taken_as_a_scalar(placement):
    x = torch.randn(3)
    assert_matches(relay(x) * torch.tensor(2.5), x * 2.5)


def test_host_memory_is_page_locked_while_ops_run_on_a_gpu(placement):
    # Page-locked host memory makes the copies of the cuda-target/cpu-home
    # path asynchronous and fast; in every other placement it would be waste.
    page_locked = placement.target == "cuda" and placement.home == "cpu"
    x = relay(torch.randn(64))
    y = x * 2  # made by the fallback, copied back to the home
    x.add_(1)  # written back in place
    assert torch_fallback.relay.home_is_page_locked(x) == page_locked
    assert torch_fallback.relay.home_is_page_locked(y) == page_locked
    torch.testing.assert_close(y.cpu() + 2, x.cpu() * 2)


def test_item_reads_on_relay_home_whatever_the_target(placement):
    x = torch.tensor([1.5, 2.5, -1.0])
    assert relay(x).sum().item() == pytest.approx(3.0)
    assert_fell_back("aten::_local_scalar_dense", placement.home)
    assert_fell_back("aten::sum.dim_IntList", placement.target)


def test_printing_a_relay_tensor(placement):
    text = str(relay(torch.tensor([[1.0, -2.0], [3.5, 4.0]])))
    assert "device='relay:0'" in text
    assert "-2.0000" in text and "3.5000" in text


def test_undefined_optional_tensor_arguments(placement):
    x, weight = torch.randn(2, 4), torch.randn(3, 4)
    assert_matches(F.linear(relay(x), relay(weight), None), F.linear(x, weight, None))


# Autograd.


def test_backward_pass(placement):
    x = torch.randn(4, 3)
    w = torch.randn(3, 2)
    x_cpu, w_cpu = x.clone().requires_grad_(), w.clone().requires_grad_()
    (x_cpu @ w_cpu).sin().pow(2).sum().backward()

    rx, rw = relay(x).requires_grad_(), relay(w).requires_grad_()
    loss = (rx @ rw).sin().pow(2).sum()
    loss.backward()
    assert_matches(rx.grad, x_cpu.grad)
    assert_matches(rw.grad, w_cpu.grad)
    assert_fell_back("aten::cos", placement.target)


@pytest.mark.parametrize("make", [relay, lambda t: relay(t) + 0], ids=["allocated", "adopted"])
def test_lazy_clone_is_copy_on_write(placement, make):
    x = make(torch.arange(6.0))
    clone = torch._lazy_clone(x)
    clone.add_(1)
    other = torch._lazy_clone(x)
    x.mul_(2)
    assert_matches(clone, torch.arange(6.0) + 1)
    assert_matches(other, torch.arange(6.0))
    assert_matches(x, torch.arange(6.0) * 2)


def test_storage_clone(placement):
    x = relay(torch.arange(5.0))
    copy = x.untyped_storage().clone()
    assert copy.device.type == "relay"
    assert_matches(torch.empty(0, device="relay").set_(copy), torch.arange(5.0))


def test_target_tensors_carry_nothing_from_one_call_to_the_next(placement):
    # Each thread reuses the TensorImpls of finished calls for the next call's
    # target tensors: none may keep the dtype, geometry, offset or lazy bits of
    # the tensor it served before.
    base = torch.randn(6, 8, dtype=torch.complex64)
    cases = [
        lambda t: t[1:, ::2].abs(),
        lambda t: t.conj().mul(2),
        lambda t: t.real.t().contiguous(),
        lambda t: torch._neg_view(t.imag)[2].exp(),
        lambda t: (t.real[0, 0] + 1).sin(),
        lambda t: t.to(torch.complex128)[3:5, 1:7:3].sqrt(),
        lambda t: t.real.to(torch.int64)[:, 2:4].mul(3),
        lambda t: t.real[:0].cos(),
        lambda t: t.real.clone().add_(1)[::2],
        lambda t: torch.mul(t.real[:, :3], 2, out=t.real.new_empty(6, 3)),
    ]
    on_relay = relay(base)
    for _ in range(3):
        for case in [*cases, *reversed(cases)]:
            expected = case(base)
            actual = case(on_relay)
            assert actual.dtype == expected.dtype and actual.shape == expected.shape
            resolved = actual.resolve_conj().resolve_neg()
            assert_matches(resolved, expected.resolve_conj().resolve_neg())


def test_results_keep_the_layout_eager_gives_them_from_call_to_call(placement):
    # An op lays its result out by its inputs' strides and memory-format flags:
    # a target tensor set up anew for each call must carry those of the tensor
    # it views, whatever the tensor it viewed before (shapes change from call to
    # call in a decode loop).
    base = torch.randn(2, 3, 4, 5)
    layouts = [
        lambda t: t,
        lambda t: t.contiguous(memory_format=torch.channels_last),
        lambda t: t.transpose(1, 3),
        lambda t: t[:, 1:, :, ::2],
        lambda t: t[:1].expand(4, 3, 4, 5),
        lambda t: t[1, 2],
        lambda t: t[:, :, :0],
        lambda t: t.permute(0, 2, 3, 1)[:, :, :3].contiguous().permute(0, 3, 1, 2),
        lambda t: t.reshape(6, 20)[:, : t.shape[-1]],
        lambda t: t[0, 0, 0, 0],
    ]
    on_relay = relay(base)
    for layout in [*layouts, *reversed(layouts), *layouts[::2], *layouts[1::2]]:
        for op in (lambda t: t.mul(2), lambda t: torch.add(t, t, alpha=3)):
            expected = op(layout(base))
            actual = op(layout(on_relay))
            assert actual.stride() == expected.stride()
            for memory_format in (torch.contiguous_format, torch.channels_last):
                if expected.dim() == 4 or memory_format == torch.contiguous_format:
                    assert actual.is_contiguous(memory_format=memory_format) == (
                        expected.is_contiguous(memory_format=memory_format)
                    )
            assert_matches(actual, expected)
    assert_fell_back("aten::mul.Tensor", placement.target)
