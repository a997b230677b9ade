"""The target tensors a call sets up again from a pool carry that call's tensors exactly.

An unboxed call runs its kernel on CPU or CUDA TensorImpls the thread set up for an
earlier call, over the relay tensors' memory. Each takes the new tensor's sizes,
strides, offset and the layout flags computed from them (contiguous, channels last,
dense), which kernels trust without looking at the strides again: a flag left from the
call before would make a kernel read a transposed tensor as contiguous, or choose
another memory format than eager. Results keep relay storages whose memory a thread
reuses after they die, on whichever thread they die.
"""

from __future__ import annotations

import gc
import io
import threading

import pytest
import torch
import torch.nn.functional as F
from checks import assert_same, eager_on_target, run_both, served_unboxed, unboxed_calls

import torch_fallback
import torch_fallback.relay

pytestmark = pytest.mark.usefixtures("placement")


def layouts() -> list[tuple[str, torch.Tensor]]:
    """Tensors of one element count and many geometries, each a flag set of its own."""
    torch.manual_seed(0)
    base = torch.randn(2, 3, 4, 5)
    return [
        ("contiguous", base.clone()),
        ("channels last", base.contiguous(memory_format=torch.channels_last)),
        ("transposed", base.transpose(1, 3)),
        ("sliced with an offset", torch.randn(3, 3, 4, 6)[1:, :, :, 1:].contiguous()[:, :, :, :5]),
        ("expanded", torch.randn(1, 3, 4, 1).expand(2, 3, 4, 5)),
        ("channels last 3d",
         torch.randn(2, 3, 2, 2, 5).contiguous(memory_format=torch.channels_last_3d)),
        ("one element", torch.randn(1, 1, 1, 1)),
        ("zero dims", torch.tensor(2.5)),
    ]  # fmt: skip


# Kernels that trust the flags: layer norm and softmax read `.contiguous()` (no copy
# where the flag says contiguous), the others pick their output's memory format from it.
def flag_readers(on, x: torch.Tensor) -> list[torch.Tensor]:
    results = [torch.relu(on(x)), on(x) * 2, torch._softmax(on(x), -1, False)]
    if x.dim() >= 1:
        results.append(F.layer_norm(on(x), x.shape[-1:]))
    if x.dim() == 4:
        weight = torch.ones(4, x.shape[1], 1, 1) / x.shape[1]
        results.append(F.conv2d(on(x), on(weight)))
        results.append(F.max_pool2d(on(x), 1))
    return results


def test_each_call_sees_its_tensors_geometry_after_calls_of_others(placement):
    # Every order of the geometries, so that each pooled impl held every other
    # geometry (and flag set) before.
    # Eager runs on the target: a GPU's convolution (TF32) differs from the CPU's.
    shapes = layouts()
    for rotation in range(len(shapes)):
        for name, x in shapes[rotation:] + shapes[:rotation]:
            actual = flag_readers(lambda t: t.to("relay"), x)
            on_target = flag_readers(eager_on_target(placement), x)
            for a, e in zip(actual, on_target, strict=True):
                assert a.device.type == "relay"
                torch.testing.assert_close(
                    a.cpu(), e.cpu(), msg=lambda m, name=name: f"{name}: {m}"
                )
                assert a.stride() == e.stride(), f"{name}: strides {a.stride()}, eager {e.stride()}"
                for fmt in (torch.contiguous_format, torch.channels_last):
                    if a.dim() == 4:
                        expected_flag = e.is_contiguous(memory_format=fmt)
                        assert a.is_contiguous(memory_format=fmt) == expected_flag, (name, fmt)
    if served_unboxed(placement):
        assert unboxed_calls() > 0


def test_views_of_one_storage_share_it_within_a_call(placement):
    # Arguments over one relay storage view one target storage: an op reading
    # overlapping slices of it, and one writing a tensor it also reads.
    x = torch.arange(12.0).reshape(3, 4)
    actual, expected = run_both(lambda on: (lambda r: torch.add(r[0], r[1:].sum(0)))(on(x)))
    assert_same(actual, expected)
    actual, expected = run_both(lambda on: (lambda r: r.add_(r))(on(x.clone())))
    assert_same(actual, expected)
    # Eager's overlap check sees the two slices of one storage: so must the views'.
    for on in (lambda t: t, lambda t: t.to("relay")):
        r = on(x.clone())
        with pytest.raises(RuntimeError, match="refer to a single memory location"):
            r[1:].mul_(r[:-1])

    # Batch norm's five tensors over one storage, two of them written (running statistics).
    def batch_norm(on):
        r = on(torch.arange(1.0, 17.0).reshape(4, 4))
        out = F.batch_norm(r[0:2, :2], r[2, 2:], r[3, 2:], r[2, :2], r[3, :2], training=True)
        return out, r

    actual, expected = run_both(batch_norm)
    assert_same(actual, expected)


def test_results_die_on_other_threads_and_memory_is_returned(placement):
    # Results live and die in any order and on any thread; relay counts their bytes
    # back, and a storage made from reused memory holds its own values. Relay tensors
    # that earlier tests left in reference cycles go first, not while this one counts.
    gc.collect()
    allocated = torch_fallback.relay.memory_allocated()
    x = torch.randn(64, device="relay")
    kept = [x + i for i in range(600)]  # more results alive than a thread keeps memory for
    for i in (0, 299, 599):
        torch.testing.assert_close(kept[i].cpu(), x.cpu() + i)

    def drop_half(results: list[torch.Tensor]) -> None:
        del results[::2]

    def multiply(x: torch.Tensor, into: list[torch.Tensor]) -> None:
        into.extend(x * i for i in range(300))

    thread = threading.Thread(target=drop_half, args=(kept,))
    thread.start()
    thread.join()
    made_on_thread: list[torch.Tensor] = []
    thread = threading.Thread(target=multiply, args=(x, made_on_thread))
    thread.start()
    thread.join()
    del kept[:50]  # freed here: the next results reuse their memory
    fresh = [x - i for i in range(300)]
    for i, (odd, product, difference) in enumerate(
        zip(kept, made_on_thread[:250], fresh[:250], strict=True)
    ):
        torch.testing.assert_close(odd.cpu(), x.cpu() + 2 * (i + 50) + 1)
        torch.testing.assert_close(product.cpu(), x.cpu() * i)
        torch.testing.assert_close(difference.cpu(), x.cpu() - i)
    # A result's storage behaves as any relay storage: resized, shared by a view, saved.
    grown = x + 1
    grown.resize_(128)
    assert grown.untyped_storage().nbytes() == 128 * 4
    torch.testing.assert_close(grown[:64].cpu(), x.cpu() + 1)
    saved = io.BytesIO()
    torch.save(fresh[7], saved)
    saved.seek(0)
    torch.testing.assert_close(torch.load(saved).cpu(), x.cpu() - 7)
    kept.clear()
    made_on_thread.clear()
    fresh.clear()
    del x, grown, odd, product, difference
    assert torch_fallback.relay.memory_allocated() == allocated
