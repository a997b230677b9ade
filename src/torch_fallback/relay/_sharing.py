"""relay tensors sent to other processes through torch.multiprocessing, as CPU tensors
are: the receiving process's tensor shares the sender's memory.

torch.multiprocessing pickles a tensor by its storage, which it shares in POSIX shared
memory for the CPU and through CUDA IPC for CUDA; a PrivateUse1 storage would take the
CPU path and fail ("only available on CPU") in the queue's feeder thread, leaving the
receiver waiting. For a relay tensor whose memory lives on the host, the reducer below
moves the storage's bytes into shared memory in place (every tensor over the storage
follows, `torch.ops.relay.rehome`), pickles a CPU view of them as torch pickles a CPU
tensor, and the receiver makes a relay tensor over the same bytes. A tensor whose memory
lives on a GPU is refused with an error that says what to do instead.
"""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing import reductions

NAME = "relay"


def _rebuild_relay_tensor(
    cls: type,
    rebuild: Callable[..., torch.Tensor],
    args: tuple[Any, ...],
    index: int,
    requires_grad: bool,
    lazy_bits: tuple[bool, bool] = (False, False),
) -> torch.Tensor:
    import torch_fallback.relay  # noqa: F401  (a spawned process has not imported it yet)

    tensor = torch.ops.relay.adopt_home(rebuild(*args), index)
    # torch's rebuild drops lazy conjugation and negation (CPU tensors lose them too);
    # they come back as the views that carry them, over the same memory.
    conj, neg = lazy_bits
    if conj:
        tensor = tensor.conj()
    if neg:
        tensor = tensor._neg_view()
    if cls is torch.nn.Parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def _in_shared_memory(tensor: torch.Tensor, home: torch.Tensor) -> torch.Tensor:
    """`home` (a CPU view of `tensor`'s bytes, with its geometry) after moving the bytes
    into shared memory, once per storage: a storage shared before is left as it is."""
    if home.untyped_storage().is_shared():
        return home
    shared = torch.UntypedStorage._new_shared(tensor.untyped_storage().nbytes())
    shared.copy_(home.untyped_storage())
    torch.ops.relay.rehome(tensor, torch.empty(0, dtype=torch.uint8).set_(shared))
    return torch.ops.relay.home_view(tensor)


def reduce_relay_tensor(tensor: torch.Tensor, reduce_other: Callable[[torch.Tensor], Any]) -> Any:
    """How torch.multiprocessing pickles `tensor`: relay tensors here, others by
    `reduce_other` (torch's own reducer)."""
    if tensor.device.type != NAME:
        return reduce_other(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        return reduce_other(tensor)  # torch's own error: autograd does not cross processes
    detached = tensor.detach()
    home = torch.ops.relay.home_view(detached)
    if home.is_cuda:
        raise RuntimeError(
            "torch_fallback.relay: a relay tensor whose memory lives on a GPU (home 'cuda') "
            "cannot be sent to another process yet. Send a copy instead, "
            "tensor.to('cpu') or a relay tensor made with home 'cpu' "
            "(torch_fallback.relay.set_home('cpu')), whose memory is shared with the "
            "receiver; or exchange tensors with torch.distributed."
        )
    rebuild, args = reduce_other(_in_shared_memory(detached, home))
    index = tensor.device.index or 0
    lazy_bits = (tensor.is_conj(), tensor.is_neg())
    return (
        _rebuild_relay_tensor,
        (type(tensor), rebuild, args, index, tensor.requires_grad, lazy_bits),
    )


def install() -> None:
    """Wraps torch.multiprocessing's tensor reducer for every tensor class it serves; CPU,
    CUDA and other tensors still reach it unchanged."""
    reducers = ForkingPickler._extra_reducers  # type: ignore[attr-defined]
    for cls, reduce in list(reducers.items()):
        if reduce is reductions.reduce_tensor:
            reducers[cls] = _wrapped(reduce)


def _wrapped(reduce_other: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    def reduce(tensor: torch.Tensor) -> Any:
        return reduce_relay_tensor(tensor, reduce_other)

    return reduce
