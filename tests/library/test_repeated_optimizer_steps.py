"""The views of a _foreach_ op's list elements are kept with the tensors.

An optimizer's _foreach_ ops view the same parameters and states at every step,
so a list element's view on the target is kept with the relay tensor that an
in-place _foreach_ op writes (once it has been written twice before: not a
temporary), and reused while it still matches the tensor.
Whatever changes a tensor between calls (new memory, new geometry, another
storage) must give it a new view, tensors that share memory must still share it
on the target, and the kept views must hold no memory past their tensors.
"""

from __future__ import annotations

import threading

import pytest
import torch
from checks import assert_same, eager_on_target, served_unboxed

import torch_fallback
import torch_fallback.relay

pytestmark = pytest.mark.usefixtures("placement")


def keep_views(tensors):
    """Writes the tensors in place until they have kept views (versions 0, 1, 2)."""
    for _ in range(3):
        torch._foreach_mul_(tensors, 1.0)


def adamw_like_steps(tensors, steps=4):
    """The _foreach_ ops of torch.optim.AdamW's foreach step, on (params, grads, m, v)."""
    params, grads, exp_avgs, exp_avg_sqs = tensors
    for step in range(1, steps + 1):
        torch._foreach_mul_(params, 1 - 1e-3)
        torch._foreach_lerp_(exp_avgs, grads, 0.1)
        torch._foreach_mul_(exp_avg_sqs, 0.999)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 0.001)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, [(1 - 0.999**step) ** 0.5] * len(denom))
        torch._foreach_add_(denom, 1e-8)
        torch._foreach_addcdiv_(params, exp_avgs, denom, [-1e-2 / (1 - 0.9**step)] * len(params))
    return params + exp_avgs + exp_avg_sqs


def optimizer_state(on, shapes=((3, 4), (4,), (2, 3, 2))):
    """params, grads, exp_avgs and exp_avg_sqs (positive, as a square's average is)."""
    torch.manual_seed(0)
    state = [[on(torch.randn(*shape)) for shape in shapes] for _ in range(3)]
    return [*state, [on(torch.rand(*shape)) for shape in shapes]]


def test_repeated_foreach_steps_on_the_same_tensors_match_eager(placement):
    expected = adamw_like_steps(optimizer_state(eager_on_target(placement)))
    actual = adamw_like_steps(optimizer_state(lambda t: t.to("relay")))
    assert_same(actual, expected)
    if served_unboxed(placement):
        assert torch_fallback.metrics()["aten::_foreach_addcdiv_.ScalarList"].calls_unboxed == 4


# Changes to a tensor between two calls that view it: (name, change). Each takes
# the tensor and a function that puts a CPU tensor where the tensor lives.
CHANGES = [
    ("resize_ to new memory", lambda t, on: t.resize_(64)[12:].fill_(0.5)),
    ("resize_ smaller, same memory", lambda t, on: t.resize_(5)),
    ("as_strided_", lambda t, on: t.as_strided_((3, 2), (1, 3), 1)),
    ("t_", lambda t, on: t.t_()),
    ("unsqueeze_", lambda t, on: t.unsqueeze_(0)),
    ("set_ another storage", lambda t, on: t.set_(on(torch.arange(12.0).reshape(3, 4)))),
    (
        "set_ an offset view",
        lambda t, on: t.set_(on(torch.arange(20.0)).untyped_storage(), 4, (4, 3), (3, 1)),
    ),
    ("copy_ new values", lambda t, on: t.copy_(on(torch.full((3, 4), 7.0)))),
]


@pytest.mark.parametrize("name, change", CHANGES, ids=[name for name, _ in CHANGES])
def test_a_tensor_changed_between_calls_gets_a_new_view(placement, name, change):
    def run(on):
        torch.manual_seed(0)
        first, second = on(torch.randn(3, 4)), on(torch.randn(3, 4))
        keep_views([first, second])
        change(first, on)
        # Each element gets its own addend: a stale view puts them in the wrong places.
        torch._foreach_add_([first], [on(torch.arange(first.numel(), dtype=first.dtype)
                                         .reshape(first.shape))])  # fmt: skip
        torch._foreach_mul_([second, first], 3.0)
        return [first, second, all_of_storage(first), all_of_storage(second)]

    actual, expected = run(lambda t: t.to("relay")), run(eager_on_target(placement))
    assert_same(actual, expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.stride() == e.stride() and a.storage_offset() == e.storage_offset()


def all_of_storage(tensor):
    """Every element of the tensor's storage, viewed or not."""
    return torch.empty(0, dtype=tensor.dtype, device=tensor.device).set_(tensor.untyped_storage())


def test_list_elements_sharing_memory_share_it_on_the_target(placement):
    def run(on):
        base = on(torch.arange(12.0))
        first, second, third, grid = base[:4], base[4:8], base[8:], base.view(3, 4)
        keep_views([first, second])
        keep_views([grid])
        # Writes to one part of the storage, reads of another (eager CUDA's
        # _foreach_ kernels run a list's tensors in parallel: no order to rely on).
        torch._foreach_add_([first, second], [third, grid[2]])
        torch._foreach_mul_([grid[:2]], [grid[2]])
        return base

    assert_same(run(lambda t: t.to("relay")), run(eager_on_target(placement)))


def test_an_overlapping_write_fails_as_eager_on_the_target_fails(placement):
    def run(on):
        base = on(torch.arange(6.0))
        later, earlier = base[1:], base[:-1]
        keep_views([later])
        keep_views([earlier])
        try:
            for _ in range(2):  # once made, once kept
                torch._foreach_add_([later], [earlier])
        except RuntimeError as error:
            return str(error).splitlines()[0], base
        return None, base

    relay_error, relay_base = run(lambda t: t.to("relay"))
    eager_error, eager_base = run(eager_on_target(placement))
    assert (relay_error is None) == (eager_error is None), (relay_error, eager_error)
    if placement.target == "cpu":  # the CPU kernels check for overlap; CUDA's fast path does not
        assert eager_error is not None
    if eager_error is not None:
        assert eager_error in relay_error
        assert_same(relay_base, eager_base)  # untouched


def test_a_shallow_copy_gets_a_view_of_its_own(placement):
    def run(on):
        param = on(torch.arange(12.0).reshape(3, 4))
        keep_views([param])
        alias = param.detach()
        alias.t_()
        torch._foreach_add_([param], 1.0)
        torch._foreach_mul_([alias], 10.0)
        data = param.data
        data.unsqueeze_(0)
        torch._foreach_add_([data], 0.5)
        return [param, alias, data]

    assert_same(run(lambda t: t.to("relay")), run(eager_on_target(placement)))


def test_a_kept_view_holds_no_memory_past_its_tensor(placement):
    # GPU memory is counted where it is freed; relay counts a tensor's bytes
    # when the tensor lets go of them, whoever else holds them.
    on_gpu = placement.home == "cuda"
    if on_gpu:
        torch.cuda.init()  # torch.cuda counts nothing before
    allocated = torch.cuda.memory_allocated if on_gpu else torch_fallback.relay.memory_allocated
    torch_fallback.relay.synchronize()
    before = allocated()
    params = [torch.zeros(1 << 16).to("relay") for _ in range(4)]
    keep_views(params)
    one = params[0].untyped_storage().nbytes()
    params[0].resize_(1 << 17)  # new memory; the old must go once a call looks again
    torch._foreach_add_(params, 1.0)
    assert allocated() - before == 5 * one
    del params
    assert allocated() == before


def test_threads_reading_kept_views_while_others_write_their_own(placement):
    shared = [torch.full((64,), 2.0).to("relay") for _ in range(3)]
    keep_views(shared)  # then read by every thread
    results: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            own = [torch.zeros(64).to("relay") for _ in range(3)]
            for _ in range(50):
                torch._foreach_add_(own, shared)
                torch._foreach_addcmul_(own, shared, shared, 0.5)
            results[index] = own
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for own in results.values():
        for tensor in own:
            torch.testing.assert_close(tensor.cpu(), torch.full((64,), 50 * (2.0 + 2.0)))
    assert len(results) == 4
