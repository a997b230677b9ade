"""The ops of inference and decoding run unboxed too (DirectKernel).

Launch-bound work (small models, a decode loop) pays the boxed fallback's host
time on every call of an op without an unboxed kernel: normalization (pow,
rsqrt), rotary embeddings (neg, sin, cos), activations, masks (comparisons,
where, masked_fill), indexing, sampling (argmax, topk, item()). Each must give
eager's result, unboxed where relay's memory is on the target.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from checks import (
    assert_same,
    assert_unboxed_where_served,
    run_both,
    served_unboxed,
    unboxed,
)
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_fallback
import torch_fallback.relay
from torch_fallback.testing.calls import boxed_calls

pytestmark = pytest.mark.usefixtures("placement")

aten = torch.ops.aten

INFERENCE_OPS = [
    "aten::pow.Tensor_Scalar", "aten::pow.Tensor_Tensor", "aten::rsqrt", "aten::sqrt",
    "aten::neg", "aten::exp", "aten::log", "aten::abs", "aten::sin", "aten::cos", "aten::tanh",
    "aten::sigmoid", "aten::silu", "aten::hardtanh", "aten::clamp", "aten::minimum",
    "aten::maximum", "aten::where.self", "aten::eq.Scalar", "aten::eq.Tensor", "aten::ne.Scalar",
    "aten::ne.Tensor", "aten::lt.Scalar", "aten::lt.Tensor", "aten::le.Scalar", "aten::le.Tensor",
    "aten::gt.Scalar", "aten::gt.Tensor", "aten::ge.Scalar", "aten::ge.Tensor",
    "aten::bitwise_and.Tensor", "aten::bitwise_or.Tensor", "aten::bitwise_not", "aten::ceil",
    "aten::floor", "aten::sign", "aten::isneginf", "aten::isposinf", "aten::tril", "aten::triu",
    "aten::masked_fill_.Scalar", "aten::index_select",
    "aten::index.Tensor", "aten::_index_put_impl_", "aten::index_add_", "aten::gather",
    "aten::scatter_.value", "aten::scatter.src", "aten::nonzero", "aten::baddbmm",
    "aten::cumsum", "aten::argmax", "aten::max", "aten::max.dim", "aten::topk", "aten::any",
    "aten::all", "aten::all.dim", "aten::any.dim", "aten::_local_scalar_dense",
    "aten::max_pool2d_with_indices", "aten::native_group_norm", "aten::silu_backward",
    "aten::sigmoid_backward", "aten::tanh_backward", "aten::hardtanh_backward",
    "aten::max_pool2d_with_indices_backward", "aten::native_group_norm_backward",
    "aten::embedding_dense_backward", "aten::arange.start_out", "aten::where.self_out",
    "aten::isin.Tensor_Tensor", "aten::div.Tensor_mode", "aten::floor_divide",
    "aten::clamp_min", "aten::scatter_.src", "aten::scatter_add_", "aten::scatter_add",
    "aten::masked_select", "aten::_weight_norm_interface", "aten::remainder.Tensor",
    "aten::remainder.Scalar", "aten::min.dim", "aten::sort.stable", "aten::amax", "aten::amin",
    "aten::nansum", "aten::clamp_",
]  # fmt: skip


def masked(on):
    x = on(torch.randn(3, 4))
    causal = torch.full((4, 4), float("-inf")).triu(1)  # a causal mask, as decoders build it
    causal = on(causal)
    return (
        x.masked_fill_(x > 0.5, -1.0), torch.where(x < 0, x, on(torch.zeros(3, 4))),
        causal.isneginf(), causal.isposinf(), causal.tril(), causal.triu(1),
    )  # fmt: skip


def indexed(on):
    x, i = on(torch.randn(5, 4)), on(torch.tensor([4, 0, 2]))
    rows = x[i, on(torch.tensor([1, 1, 3]))]  # index.Tensor
    x[on(torch.tensor([0, 3]))] = on(torch.ones(2, 4))  # _index_put_impl_
    return rows, x, torch.index_select(x, 1, on(torch.tensor([3, 0]))), x[x > 0]


def scattered(on):
    # Distinct indices per row: a scatter onto one element twice has no defined winner on CUDA.
    x, i = on(torch.zeros(3, 5)), on(torch.tensor([[0, 4, 2], [1, 3, 0]]))
    src = on(torch.arange(6.0).reshape(2, 3))
    return (
        torch.gather(on(torch.randn(3, 5)), 1, i.clamp(max=4)),
        x.clone().scatter_(1, i, 7.0),
        torch.scatter(x, 1, i, src),
        x.index_add_(0, on(torch.tensor([2, 0])), on(torch.ones(2, 5))),
    )


def sampled(on):
    logits = on(torch.randn(2, 11))
    values, indices = torch.topk(logits, 3)
    best, where = logits.max(-1)
    return (
        logits.argmax(-1), values, indices, best, where, logits.max(), torch.cumsum(logits, 1),
        torch.nonzero(logits > 0), (logits > 3).any(), (logits > -9).all(1),
    )  # fmt: skip


def stopping_and_routing(on):
    # generate()'s end-of-sequence check, F.normalize, floor division of positions,
    # a mixture of experts' routing weights, a mask's selection, weight norm.
    ids, eos = on(torch.tensor([[5, 2, 9, 2], [7, 1, 1, 3]])), on(torch.tensor([2, 7]))
    x, i = on(torch.randn(3, 4)), on(torch.tensor([[0, 3], [2, 1], [1, 0]]))
    routed = on(torch.randn(3, 2))
    positions = on(torch.arange(9))
    weight = on(torch.randn(6, 4, 3))
    return (
        torch.isin(ids, eos), torch.isin(ids, eos, invert=True), F.normalize(x, dim=-1),
        torch.div(positions, 4, rounding_mode="floor"), positions // 2,
        torch.div(x, on(torch.tensor(0.3)), rounding_mode="trunc"),
        on(torch.zeros(3, 4)).scatter_(1, i, routed), torch.scatter_add(x, 1, i, routed),
        x.clone().scatter_add_(1, i, routed), torch.masked_select(x, x > 0),
        *torch._weight_norm_interface(weight, on(torch.rand(6, 1, 1)), 0),
    )  # fmt: skip


def beams_and_sampling_filters(on):
    # Beam search splits flat indices into beam and token (remainder, floor division);
    # top-p and min-p filters sort probabilities and scale by their maximum;
    # typical-p sums entropies (nansum).
    scores = on(torch.randn(2, 12))
    flat = torch.topk(scores.view(1, -1), 4).indices
    probs = scores.softmax(-1)
    sorted_probs, order = torch.sort(probs, descending=True, stable=True)
    with_nan = scores.clone().masked_fill_(scores > 1, float("nan"))
    return (
        flat % on(torch.tensor(12)), flat % 5, flat.min(-1), sorted_probs, order,
        probs.amax(-1, keepdim=True), probs.amin(-1), torch.nansum(with_nan, -1),
        scores.clone().clamp_(-0.5, 0.5),
    )  # fmt: skip


def rms_norm(on):
    x, weight = on(torch.randn(2, 5, 8)), on(torch.rand(8))
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def rotary(on):
    x, angles = on(torch.randn(2, 4, 6, 8)), on(torch.randn(6, 8))
    half = torch.cat((-x[..., 4:], x[..., :4]), dim=-1)
    return x * angles.cos() + half * angles.sin()


def activations_and_their_backward(on):
    x = on(torch.randn(4, 6)).requires_grad_()
    y = F.silu(x) + torch.sigmoid(x) + torch.tanh(x) + F.hardtanh(x, -0.5, 0.5)
    (grad,) = torch.autograd.grad(y.sum(), x)
    return y.detach(), grad


def group_norm_and_pooling_backward(on):
    x = on(torch.randn(2, 4, 6, 6)).requires_grad_()
    weight, bias = on(torch.rand(4)).requires_grad_(), on(torch.randn(4)).requires_grad_()
    y = F.max_pool2d(F.group_norm(x, 2, weight, bias), 2)
    return y.detach(), *torch.autograd.grad(y.square().sum(), (x, weight, bias))


def embedding_backward(on):
    weight = on(torch.randn(7, 3)).requires_grad_()
    y = F.embedding(on(torch.tensor([[1, 6, 1], [0, 2, 6]])), weight)
    return torch.autograd.grad(y.square().sum(), weight)


# (name, ops it must count, call): each call takes a function that puts a CPU tensor where it runs.
CALLS = [
    ("rms_norm", ["aten::pow.Tensor_Scalar", "aten::rsqrt"], rms_norm),
    ("stopping and routing", ["aten::isin.Tensor_Tensor", "aten::clamp_min",
                              "aten::div.Tensor_mode", "aten::floor_divide",
                              "aten::scatter_.src", "aten::scatter_add", "aten::scatter_add_",
                              "aten::masked_select", "aten::_weight_norm_interface"],
     stopping_and_routing),
    ("beam search and sampling filters", ["aten::remainder.Tensor", "aten::remainder.Scalar",
                                          "aten::min.dim", "aten::sort.stable", "aten::amax",
                                          "aten::amin", "aten::nansum", "aten::clamp_"],
     beams_and_sampling_filters),
    ("rotary", ["aten::neg", "aten::sin", "aten::cos"], rotary),
    ("pointwise", ["aten::exp", "aten::log", "aten::abs", "aten::sqrt", "aten::sign"],
     lambda on: (lambda x: (x.exp(), x.abs().log(), x.abs().sqrt(), x.sign(), x.ceil(),
                            x.floor(), x.clamp(-1, 1), x.pow(on(torch.full((4,), 2.0)))))(
         on(torch.randn(4)))),
    ("compare", ["aten::eq.Tensor", "aten::ge.Scalar", "aten::bitwise_and.Tensor"],
     lambda on: (lambda a, b: ((a == b) & (a >= 0), (a != b) | (a < b), ~(a <= 1), a > b,
                               a == 1, a != 0, a < 0, a > 1, a <= b, a >= b,
                               torch.minimum(a, b), torch.maximum(a, b)))(
         on(torch.tensor([0.0, 1.0, 2.0, -1.0])), on(torch.tensor([0.0, 2.0, 1.0, -1.0])))),
    ("masks", ["aten::masked_fill_.Scalar", "aten::where.self", "aten::isneginf", "aten::tril"],
     masked),
    ("indexing", ["aten::index.Tensor", "aten::_index_put_impl_", "aten::index_select"], indexed),
    ("scatter and gather", ["aten::gather", "aten::scatter_.value", "aten::index_add_"],
     scattered),
    ("sampling", ["aten::argmax", "aten::topk", "aten::max.dim", "aten::nonzero"], sampled),
    ("baddbmm", ["aten::baddbmm"],
     lambda on: torch.baddbmm(on(torch.randn(2, 3, 2)), on(torch.randn(2, 3, 4)),
                              on(torch.randn(2, 4, 2)), beta=0.5, alpha=2.0)),
    ("activations", ["aten::silu", "aten::silu_backward", "aten::hardtanh_backward"],
     activations_and_their_backward),
    ("group norm and pooling", ["aten::native_group_norm_backward",
                                "aten::max_pool2d_with_indices_backward"],
     group_norm_and_pooling_backward),
    ("embedding backward", ["aten::embedding_dense_backward"], embedding_backward),
]  # fmt: skip


def test_the_inference_ops_have_unboxed_kernels_on_relay():
    missing = [
        op
        for op in INFERENCE_OPS
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")
    ]
    assert not missing, f"no PrivateUse1 kernel for {missing}"


@pytest.mark.parametrize("name, ops, call", CALLS, ids=[name for name, _, _ in CALLS])
def test_inference_op_matches_eager_unboxed_where_relay_memory_is(placement, name, ops, call):
    actual, expected = run_both(call)
    assert_same(actual, expected)
    assert_unboxed_where_served(ops, placement)


ARANGES = [
    ((5,), {}), ((1, 10, 3), {}), ((0.0, 1.0, 0.1), {}), ((2, -7, -2), {}), ((0,), {}),
    ((10,), {"dtype": torch.float16}), ((0, 1, 1 / 3), {"dtype": torch.float64}),
]  # fmt: skip
# Fractional bounds or steps with an integer dtype: torch releases size these differently
# (some truncate the bounds first), so the fallback leaves them to the boxed path.
INTEGER_ARANGES = [((0, 5, 0.7), {"dtype": torch.int32}), ((0.5, 3.7, 1.0), {"dtype": torch.long})]


def test_arange_matches_eager_unboxed_where_relay_memory_is(placement):
    """torch.arange on relay (arange.start_out on an empty tensor, which it sizes)."""
    for args, kwargs in ARANGES:
        assert_same(torch.arange(*args, device="relay", **kwargs), torch.arange(*args, **kwargs))
    expected = len(ARANGES) if served_unboxed(placement) else 0
    assert unboxed("aten::arange.start_out") == expected
    assert torch_fallback.metrics()["aten::arange.start_out"].calls == len(ARANGES)
    for args, kwargs in INTEGER_ARANGES:
        assert_same(torch.arange(*args, device="relay", **kwargs), torch.arange(*args, **kwargs))
    assert unboxed("aten::arange.start_out") == expected  # served boxed, each in one call
    all_calls = len(ARANGES) + len(INTEGER_ARANGES)
    assert torch_fallback.metrics()["aten::arange.start_out"].calls == all_calls


def test_arange_into_an_output_keeps_eagers_rules(placement):
    """An output of the right size keeps its shape and memory (a view writes its base);
    one of another size is resized with eager's warning; a bad range fails as in eager."""
    out = torch.empty(2, 3, dtype=torch.long, device="relay")
    torch.arange(6, out=out)
    assert out.shape == (2, 3) and torch.equal(out.cpu(), torch.arange(6).view(2, 3))
    base = torch.zeros(10, dtype=torch.long, device="relay")
    torch.arange(5, out=base[2:7])
    assert torch.equal(base.cpu(), torch.tensor([0, 0, 0, 1, 2, 3, 4, 0, 0, 0]))
    wrong_size = torch.empty(4, device="relay")
    with pytest.warns(UserWarning, match="does not match the computed number of elements 6"):
        torch.arange(6, out=wrong_size)
    assert torch.equal(wrong_size.cpu(), torch.arange(6.0))
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        torch.arange(0, 10, 0, device="relay")


def safe_softmax(on):
    # The math attention's softmax: rows masked out whole give zeros, written by
    # where's out= form into the softmax's own output.
    scores = torch.randn(2, 3, 4)
    scores[0, 1] = float("-inf")
    return aten._safe_softmax(on(scores), -1)


def where_into_outputs(on):
    cond, x, y = on(torch.rand(3, 1) > 0.5), on(torch.randn(3, 4)), on(torch.randn(4))
    sized = on(torch.empty(3, 4))
    torch.where(cond, x, y, out=sized)
    empty = on(torch.empty(0))  # sized by the kernel, as eager's resize_output sizes it
    torch.where(cond, x, y, out=empty)
    base = on(torch.zeros(5, 4))
    torch.where(cond, x, y, out=base[1:4])  # a view writes its base
    aliased = on(torch.randn(3, 4))
    torch.where(cond, on(torch.tensor(0.0)), aliased, out=aliased)  # _safe_softmax's call
    return sized, empty, base, aliased


def test_where_into_an_output_matches_eager_unboxed_where_relay_memory_is(placement):
    for call in (safe_softmax, where_into_outputs):
        actual, expected = run_both(call)
        assert_same(actual, expected)
    served = torch_fallback.metrics()["aten::where.self_out"]
    assert served.calls == 5
    assert served.calls_unboxed == (5 if served_unboxed(placement) else 0)


def test_the_math_attention_makes_no_boxed_call(placement):
    """Where no fused kernel serves the attention (float32 with a mask on CUDA, or
    chosen), its math path runs on relay's tensors: every op of it unboxed."""
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[0] = False  # a row masked out whole: _safe_softmax gives it zeros

    def attention(on):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(on(q), on(k), on(v), attn_mask=on(mask))

    actual, expected = run_both(attention)
    assert_same(actual, expected)
    assert unboxed("aten::where.self_out") == (1 if served_unboxed(placement) else 0)
    if served_unboxed(placement):
        assert boxed_calls() == {}


def test_where_into_an_output_of_another_size_keeps_eagers_rules(placement):
    """An output of another size is resized with eager's warning; arguments that do
    not broadcast fail as in eager. Both are served boxed, each in one call."""
    cond, x, y = torch.rand(3, 1) > 0.5, torch.randn(3, 4), torch.randn(4)
    wrong_size = torch.empty(2, device="relay")
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.where(cond.to("relay"), x.to("relay"), y.to("relay"), out=wrong_size)
    assert torch.equal(wrong_size.cpu(), torch.where(cond, x, y))
    with pytest.raises(RuntimeError, match=r"size of tensor a \(4\) must match .* \(5\)"):
        torch.where(cond.to("relay"), x.to("relay"), torch.zeros(5, device="relay"), out=wrong_size)
    served = torch_fallback.metrics()["aten::where.self_out"]
    assert served.calls == 2 and served.calls_unboxed == 0


ITEM_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.uint8, torch.bool, torch.complex64,
]  # fmt: skip


def test_item_reads_where_relay_memory_is(placement):
    """item() (_local_scalar_dense) reads the element on relay's home, whatever the
    target: unboxed, with no copy of the tensor (on a GPU, eager's read there)."""
    x = torch.tensor([2.5, -1.0]).to("relay")
    assert x[0].item() == 2.5 and (x < 0).any().item() is True
    for dtype in ITEM_DTYPES:
        values = torch.tensor([3.0, 1.0, 0.0]).to(dtype)
        got = values.to("relay")[1].item()  # an element off the storage's start
        assert got == values[1].item() and type(got) is type(values[1].item()), dtype
    reads = 2 + len(ITEM_DTYPES)
    stats = torch_fallback.metrics()["aten::_local_scalar_dense"]
    assert stats.calls_unboxed == reads and stats.bytes_to_target == 0
    on_cpu = placement.home == "cpu"
    assert (stats.calls_cpu, stats.calls_cuda) == ((reads, 0) if on_cpu else (0, reads))


def test_item_on_the_cpu_op_list_reads_a_copy_on_the_cpu(placement):
    torch_fallback.set_cpu_ops(["aten::_local_scalar_dense"])
    x = torch.tensor([2.5, -1.0]).to("relay")
    assert x[1].item() == -1.0
    stats = torch_fallback.metrics()["aten::_local_scalar_dense"]
    assert stats.calls_cpu == 1
    assert stats.calls_unboxed == (1 if placement.home == "cpu" else 0)


def decoder_step(on, cache: list[torch.Tensor], token: torch.Tensor) -> torch.Tensor:
    """One greedy step of a one-layer decoder with a KV cache, as Llama writes it."""
    torch.manual_seed(0)
    d, heads, vocab = 8, 2, 11
    embed, w_qkv = on(torch.randn(vocab, d)), on(torch.randn(d, 3 * d) / d)
    w_up, w_down, norm = on(torch.randn(d, 2 * d)), on(torch.randn(2 * d, d)), on(torch.rand(d))
    x = F.embedding(token, embed)
    x = norm * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    q, k, v = (x @ w_qkv).view(1, -1, 3, heads, d // heads).unbind(2)
    position = len(cache[0]) if cache else 0
    angle = on(torch.full((d // heads,), float(position + 1)))
    k = k * angle.cos() + torch.cat((-k[..., 2:], k[..., :2]), -1) * angle.sin()
    cache[:] = [torch.cat((cache[0], k), 1), torch.cat((cache[1], v), 1)] if cache else [k, v]
    attended = F.scaled_dot_product_attention(
        q.transpose(1, 2), cache[0].transpose(1, 2), cache[1].transpose(1, 2)
    )
    x = x + attended.transpose(1, 2).reshape(1, -1, d)
    logits = (F.silu(x @ w_up) @ w_down) @ embed.t()
    next_token = logits[:, -1].argmax(-1, keepdim=True)
    assert bool((next_token >= 0).all())
    return next_token


@pytest.mark.parametrize("grad_off", ["no_grad", "inference_mode"])
def test_a_decode_loop_makes_no_boxed_call(placement, grad_off):
    # Decoding servers run under torch.inference_mode: its calls set their target
    # tensors up from a pool of inference tensors, apart from the other calls'.
    def decode(on):
        cache: list[torch.Tensor] = []
        tokens = [on(torch.tensor([[3]]))]
        with getattr(torch, grad_off)():
            for _ in range(6):
                tokens.append(decoder_step(on, cache, tokens[-1]))
            return torch.cat(tokens, 1)

    actual, expected = run_both(decode)
    assert_same(actual, expected)
    assert actual.is_inference() == expected.is_inference() == (grad_off == "inference_mode")
    if served_unboxed(placement):
        # The tensors the loop makes on relay (torch.tensor, randn's copies) are copies, not ops.
        assert boxed_calls() == {}, "boxed calls in a decode loop"


def parked(target: str) -> tuple[int, int]:
    """This thread's parked target TensorImpls on `target`: (for calls outside
    inference mode, for calls in it)."""
    counts = torch.ops.torch_fallback.parked_target_impls()
    return (counts[2], counts[3]) if target == "cuda" else (counts[0], counts[1])


def test_calls_in_inference_mode_and_out_of_it_keep_their_own_target_tensors(placement):
    # Inference tensors have no version counter: one serving a call outside
    # inference mode would lose the writes autograd checks. Each mode's calls
    # get target tensors of their own kind, as eager makes them in that mode.
    x, w = torch.randn(4, 3), torch.randn(5, 3)
    ops = [
        lambda on: F.linear(on(x), on(w)),
        lambda on: torch.relu(on(x)) * 2,
        lambda on: torch.add(on(x), 1, out=on(torch.empty(4, 3))),
        lambda on: on(x.clone()).mul_(3),
        lambda on: torch._foreach_mul([on(x), on(w)], 2),
    ]
    outside_before = parked(placement.target)[0]
    for _ in range(2):
        for op in ops:
            with torch.inference_mode():
                actual, expected = run_both(op)
            assert_same(actual, expected)
            results = list(actual) if isinstance(actual, (list, tuple)) else [actual]
            assert all(result.is_inference() for result in results)
    outside, inside = parked(placement.target)
    assert outside == outside_before, "calls in inference mode parked tensors of the others"
    if served_unboxed(placement):
        assert inside > 0, "calls in inference mode set up no pooled target tensor"

    # Outside inference mode, after those calls: writes count for autograd again,
    # through an in-place op and an optimizer's _foreach_ op (its kept views).
    weight = torch.randn(4, 3).to("relay").requires_grad_()
    states = [torch.zeros(4, 3).to("relay") for _ in range(2)]
    for _ in range(3):
        torch._foreach_add_(states, [weight.detach(), weight.detach()])
    saved = torch.randn(4, 3).to("relay")
    loss = (weight * saved).sum()
    saved.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()
    for state in states:
        assert state._version == 3
        torch.testing.assert_close(state.cpu(), 3 * weight.detach().cpu())


def test_a_first_call_in_inference_mode_leaves_the_other_calls_their_pool(placement):
    # Which plain TensorImpls the pool takes back was decided by the mode of the
    # process's first fallback call; one in inference mode left every later call
    # outside it to allocate its target tensors anew.
    script = textwrap.dedent(
        f"""
        import torch
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target("{placement.target}")
        torch_fallback.relay.set_home("{placement.home}")
        with torch.inference_mode():
            torch.relu(torch.ones(3, device="relay"))
        x = torch.ones(3, device="relay")
        for _ in range(3):
            x = x * 2
        assert x.cpu().tolist() == [8.0, 8.0, 8.0]
        print(torch.ops.torch_fallback.parked_target_impls())
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    counts = [int(n) for n in done.stdout.strip().strip("[]").split(",")]
    outside = counts[2] if placement.target == "cuda" else counts[0]
    if served_unboxed(placement):
        assert outside > 0, "calls outside inference mode park no target tensor"
