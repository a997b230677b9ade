"""In-place ops, the optimizers' _foreach_ ops and dropout run unboxed too.

An in-place op writes relay's memory through a view of it, so the relay tensor
keeps its identity and storage. Tensors that share a relay storage share one
target storage, so that the kernels' overlap checks see what eager's see.
"""

from __future__ import annotations

import pytest
import torch
from checks import (
    assert_same,
    calls_on,
    eager_on_target,
    run_both,
    served_unboxed,
    unboxed_calls,
)

import torch_fallback

pytestmark = pytest.mark.usefixtures("placement")

aten = torch.ops.aten

IN_PLACE_OPS = [
    "aten::add_.Tensor", "aten::sub_.Tensor", "aten::mul_.Tensor", "aten::div_.Tensor",
    "aten::mul_.Scalar", "aten::zero_", "aten::fill_.Scalar", "aten::_foreach_add_.Scalar",
    "aten::_foreach_add_.List", "aten::_foreach_mul_.Scalar", "aten::_foreach_mul_.List",
    "aten::_foreach_div_.ScalarList", "aten::_foreach_addcmul_.Scalar",
    "aten::_foreach_addcdiv_.ScalarList", "aten::_foreach_lerp_.Scalar", "aten::_foreach_zero_",
]  # fmt: skip
OTHER_OPS = ["aten::_foreach_sqrt", "aten::native_dropout", "aten::native_dropout_backward"]


def grid(on):
    return on(torch.arange(24.0).reshape(4, 6))


def tensors(on, count=3):
    return [on(torch.rand(2, 3) + 0.5) for _ in range(count)]


# (name, call): each call takes a function that puts a CPU tensor where the op
# runs, and returns the tensors it wrote.
CALLS = [
    ("add_ slice, transposed other", lambda on: grid(on)[:, 1:5].add_(on(torch.randn(4, 4)).t(),
                                                                        alpha=2)),
    ("add_ self", lambda on: (lambda x: x.add_(x))(on(torch.randn(5)))),
    ("add_ python number", lambda on: on(torch.randn(3)).add_(1.5)),
    ("sub_ broadcast", lambda on: on(torch.randn(3, 4)).sub_(on(torch.randn(4)))),
    ("mul_ cpu scalar tensor", lambda on: on(torch.randn(3)).mul_(torch.tensor(0.5))),
    ("mul_.Scalar", lambda on: aten.mul_.Scalar(on(torch.randn(2, 2)), 3)),
    ("div_ conj", lambda on: on(torch.randn(4, dtype=torch.cfloat)).div_(
        on(torch.randn(4, dtype=torch.cfloat)).conj())),
    ("zero_ strided view", lambda on: grid(on)[::2, 1::2].zero_()),
    ("fill_ offset view", lambda on: grid(on)[1:3].fill_(7)),
    ("fill_ bool", lambda on: on(torch.zeros(3, dtype=torch.bool)).fill_(True)),
    ("_foreach_add_ list", lambda on: (lambda a, b: (torch._foreach_add_(a, b, alpha=0.5), a)[1])(
        tensors(on), tensors(on))),
    ("_foreach_add_ scalar", lambda on: (lambda a: (torch._foreach_add_(a, 1.0), a)[1])(
        tensors(on))),
    ("_foreach_mul_ scalar, one storage", lambda on: (lambda x: (
        torch._foreach_mul_([x[:2], x[2:]], 2.0), [x])[1])(on(torch.randn(5)))),
    ("_foreach_mul_ list", lambda on: (lambda a, b: (torch._foreach_mul_(a, b), a)[1])(
        tensors(on), tensors(on))),
    ("_foreach_div_ scalar list", lambda on: (lambda a: (
        torch._foreach_div_(a, [1.0, 2.0, 4.0]), a)[1])(tensors(on))),
    ("_foreach_addcmul_", lambda on: (lambda a, b, c: (
        torch._foreach_addcmul_(a, b, c, value=0.1), a)[1])(tensors(on), tensors(on),
                                                          tensors(on))),
    ("_foreach_addcdiv_ scalar list", lambda on: (lambda a, b, c: (
        torch._foreach_addcdiv_(a, b, c, [0.1, 0.2, 0.3]), a)[1])(tensors(on), tensors(on),
                                                                 tensors(on))),
    ("_foreach_lerp_", lambda on: (lambda a, b: (torch._foreach_lerp_(a, b, 0.1), a)[1])(
        tensors(on), tensors(on))),
    ("_foreach_zero_", lambda on: (lambda a: (torch._foreach_zero_(a), a)[1])(tensors(on))),
]  # fmt: skip


def test_the_in_place_ops_and_dropout_have_unboxed_kernels_on_relay():
    missing = [
        op
        for op in IN_PLACE_OPS + OTHER_OPS
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")
    ]
    assert not missing, f"no PrivateUse1 kernel for {missing}"


@pytest.mark.parametrize("name, call", CALLS, ids=[name for name, _ in CALLS])
def test_in_place_op_writes_relay_memory_as_eager_writes(placement, name, call):
    torch.manual_seed(0)
    expected = call(lambda t: t)
    torch.manual_seed(0)
    written = []

    def on_relay(t):
        t = t.to("relay")
        written.append((t, t.untyped_storage().data_ptr()))
        return t

    actual = call(on_relay)
    assert_same(actual, expected)
    # The relay tensors were written where they are: same storage, same memory.
    for tensor, data_ptr in written:
        assert tensor.untyped_storage().data_ptr() == data_ptr
    served = sum(calls_on(op, placement.target) for op in IN_PLACE_OPS)
    assert served > 0, torch_fallback.metrics()
    assert (unboxed_calls() > 0) == served_unboxed(placement)


def test_an_in_place_op_on_overlapping_memory_fails_as_eager_fails(placement):
    x = torch.arange(6.0)
    with pytest.raises(RuntimeError, match="single memory location") as eager:
        x[1:].add_(x[:-1])
    y = torch.arange(6.0).to("relay")
    with pytest.raises(RuntimeError, match="single memory location") as relay:
        y[1:].add_(y[:-1])
    assert str(eager.value).splitlines()[0] in str(relay.value)
    assert torch.equal(y.cpu(), torch.arange(6.0))


def test_an_in_place_op_that_cannot_cast_fails_as_eager_fails(placement):
    message = "result type Float can't be cast to the desired output type Long"
    with pytest.raises(RuntimeError, match=message):
        torch.arange(4).div_(torch.full((4,), 3))
    with pytest.raises(RuntimeError, match=message):
        torch.arange(4).to("relay").div_(torch.full((4,), 3).to("relay"))


def test_foreach_sqrt_gives_new_relay_tensors(placement):
    actual, expected = run_both(lambda on: torch._foreach_sqrt(tensors(on)))
    assert_same(actual, expected)
    assert (torch_fallback.metrics()["aten::_foreach_sqrt"].calls_unboxed == 1) == served_unboxed(
        placement
    )


def test_dropout_keeps_what_its_mask_keeps_and_its_backward_scales(placement):
    x = torch.rand(64, 64).to("relay") + 1
    out, mask = aten.native_dropout(x, 0.25, True)
    assert mask.device.type == "relay" and mask.dtype == torch.bool
    torch.testing.assert_close(out.cpu(), x.cpu() * mask.cpu() / 0.75)
    kept = mask.cpu().float().mean().item()
    assert 0.65 < kept < 0.85
    grad = aten.native_dropout_backward(torch.ones_like(x), mask, 1 / 0.75)
    torch.testing.assert_close(grad.cpu(), mask.cpu() / 0.75)
    if placement.target == "cpu":  # the CPU generator, seeded as eager's
        torch.manual_seed(3)
        expected = aten.native_dropout(torch.ones(50), 0.5, True)
        torch.manual_seed(3)
        actual = aten.native_dropout(torch.ones(50).to("relay"), 0.5, True)
        assert_same(actual, expected)
    dropout = torch_fallback.metrics()["aten::native_dropout"]
    assert (dropout.calls_unboxed > 0) == served_unboxed(placement)


def written_versions(call, on):
    """How many writes each tensor `call` made saw counted (its version's growth)."""
    made = []

    def tracked(t):
        t = on(t)
        made.append((t, t._version))
        return t

    call(tracked)
    return [t._version - before for t, before in made]


@pytest.mark.parametrize("name, call", CALLS, ids=[name for name, _ in CALLS])
def test_in_place_op_counts_its_writes_as_eager_on_the_target_counts_them(placement, name, call):
    expected = written_versions(call, eager_on_target(placement))
    assert written_versions(call, lambda t: t.to("relay")) == expected
    if placement.target == "cpu":  # eager CUDA's _foreach_zero_ and _foreach_lerp_ count none
        assert sum(expected) > 0


# In-place _foreach_ ops, unboxed and through the boxed fallback (abs_, exp_, copy_).
FOREACH_WRITES = [
    ("_foreach_add_", lambda ts: torch._foreach_add_(ts, 1.0)),
    ("_foreach_mul_ list", lambda ts: torch._foreach_mul_(ts, [t.clone() for t in ts])),
    ("_foreach_zero_", lambda ts: torch._foreach_zero_(ts)),
    ("_foreach_lerp_", lambda ts: torch._foreach_lerp_(ts, [t + 1 for t in ts], 0.5)),
    (
        "_foreach_addcdiv_",
        lambda ts: torch._foreach_addcdiv_(ts, ts, [t.abs() + 1 for t in ts], [0.5] * len(ts)),
    ),
    ("_foreach_abs_", lambda ts: torch._foreach_abs_(ts)),
    ("_foreach_exp_", lambda ts: torch._foreach_exp_(ts)),
    ("_foreach_copy_", lambda ts: torch._foreach_copy_(ts, [t + 1 for t in ts])),
]


@pytest.mark.parametrize("written_before", [0, 3], ids=["fresh", "written-before"])
@pytest.mark.parametrize("name, write", FOREACH_WRITES, ids=[name for name, _ in FOREACH_WRITES])
def test_autograd_sees_a_foreach_write_to_a_saved_tensor(placement, name, write, written_before):
    def tensors(on):
        saved, other = on(torch.randn(3)), on(torch.randn(2))
        for _ in range(written_before):  # an optimizer state's history
            torch._foreach_mul_([saved, other], 1.0)
        return saved, other

    # Whether eager on the target counts the write (eager CUDA's _foreach_zero_
    # and _foreach_lerp_ do not): autograd can only see a counted one.
    saved, other = tensors(eager_on_target(placement))
    before = saved._version
    write([other, saved])
    counted = saved._version > before
    assert counted or placement.target == "cuda"

    weight = torch.randn(3).to("relay").requires_grad_()
    saved, other = tensors(lambda t: t.to("relay"))
    loss = (weight * saved).sum()
    write([other, saved])
    if counted:
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()
    else:
        loss.backward()


# Custom ops with kernels for CPU and CUDA only: relay tensors reach them through
# the fallback. torch.library.custom_op counts a mutated argument's write in its
# ADInplaceOrView layer, and the kernel's own in-place ops count theirs.
@torch.library.custom_op("torch_fallback_tests::scale_", mutates_args=("x",),
                         device_types=("cpu", "cuda"))  # fmt: skip
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@torch.library.custom_op("torch_fallback_tests::scaled_into", mutates_args=("out",),
                         device_types=("cpu", "cuda"))  # fmt: skip
def scaled_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    torch.mul(x, 2, out=out)
    out.add_(1)
    return x + 1


# A kernel registered without custom_op's layers: only its own writes count.
_LIBRARY = torch.library.Library("torch_fallback_tests", "DEF")
_LIBRARY.define("plain_fill_(Tensor(a!) x, float value) -> ()")


def _plain_fill_(x: torch.Tensor, value: float) -> None:
    x.fill_(value)


for _key in ("CPU", "CUDA"):
    _LIBRARY.impl("plain_fill_", _plain_fill_, _key)

CUSTOM_OP_CALLS = [
    ("custom_op in place", lambda on: (lambda x: (scale_(x, 3.0), x)[1])(on(torch.randn(5)))),
    ("custom_op out and result", lambda on: (lambda x, out: (scaled_into(x, out), out, x)[1:])(
        on(torch.randn(4)), on(torch.zeros(4)))),
    ("library kernel", lambda on: (lambda x: (torch.ops.torch_fallback_tests.plain_fill_(x, 2.0),
                                              x)[1])(on(torch.randn(3)))),
]  # fmt: skip


@pytest.mark.parametrize("name, call", CUSTOM_OP_CALLS, ids=[n for n, _ in CUSTOM_OP_CALLS])
def test_a_custom_op_counts_its_writes_as_eager_on_the_target_counts_them(placement, name, call):
    expected = written_versions(call, eager_on_target(placement))
    assert sum(expected) > 0
    assert written_versions(call, lambda t: t.to("relay")) == expected
    torch.manual_seed(0)
    expected_values = call(eager_on_target(placement))
    torch.manual_seed(0)
    assert_same(call(lambda t: t.to("relay")), expected_values)
