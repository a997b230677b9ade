"""torch.distributed for any backend of the library: collectives on PyTorch's own engines.

c10d sends a device's collectives to the backend registered for its device type.
``register("relay")`` registers one whose every collective runs on the engine of
the memory the tensors live in, on zero-copy views of it: ProcessGroupGloo for
host memory, ProcessGroupNCCL for CUDA memory. Nothing is reimplemented: the
engines do the work, with their own timeouts and errors.

    import torch.distributed as dist
    import torch_fallback.relay              # registers "relaycc" for relay tensors
    dist.init_process_group()                # cpu:gloo,relay:relaycc
    dist.init_process_group("cpu:gloo,relay:relaycc")  # the same, spelled out

Importing this module registers nothing; a backend calls ``register`` (relay does
on import).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._extension import ops

__all__ = ["backend_name", "register"]


def backend_name(device: str) -> str:
    """The c10d backend name ``register(device)`` gives: ``<device>cc`` ("relaycc")."""
    return f"{device}cc"


def register(device: str) -> str | None:
    """Register the c10d backend for ``device`` (a backend of the library, already
    imported); returns its name, or None where torch has no torch.distributed."""
    if not dist.is_available():
        return None
    name = backend_name(device)
    if name.upper() in dist.Backend._plugins:
        return name

    def create(options: dist.distributed_c10d._DistributedBackendOptions, _: object) -> object:
        host, cuda = _host_engine(options), _cuda_engine(options)
        for engine in (host, cuda):
            if engine is not None:  # as c10d does for the groups it makes itself
                engine._set_sequence_number_for_group()
        # A whole process group, not only a backend: init_process_group() with no backend
        # would otherwise make gloo the group's default backend, which DDP asks for by type
        # and this group has none of. It serves CPU tensors too (gloo), whatever was named.
        group = dist.ProcessGroup(options.store, options.group_rank, options.group_size)
        ops.serve_home(
            group.boxed(),
            device,
            name,
            _carrier(options, host, "cpu", dist.ProcessGroup.BackendType.GLOO),
            _carrier(options, cuda, "cuda", dist.ProcessGroup.BackendType.NCCL),
        )
        return group

    # CPU tensors too (on gloo), so init_process_group(name) serves both, as "nccl" does
    # CUDA's; with no backend named, init_process_group() takes it for the device.
    dist.Backend.register_backend(name, create, extended_api=True, devices=[device, "cpu"])
    return name


def _carrier(
    options: dist.distributed_c10d._DistributedBackendOptions,
    engine: object | None,
    device: str,
    kind: dist.ProcessGroup.BackendType,
) -> object | None:
    """A process group holding only ``engine``: the form in which a c10d backend
    crosses torch.ops (as a TorchBind object) to the library."""
    if engine is None:
        return None
    carrier = dist.ProcessGroup(options.store, options.group_rank, options.group_size)
    carrier._register_backend(torch.device(device), kind, engine)
    return carrier.boxed()


def _host_engine(options: dist.distributed_c10d._DistributedBackendOptions) -> object | None:
    if not dist.is_gloo_available():
        return None
    store = dist.PrefixStore("gloo/", options.store)
    engine = dist.ProcessGroupGloo(store, options.group_rank, options.group_size, options.timeout)
    engine.options.global_ranks_in_group = options.global_ranks_in_group
    engine.options.group_name = options.group_id
    return engine


def _cuda_engine(options: dist.distributed_c10d._DistributedBackendOptions) -> object | None:
    """NCCL where torch has it and a GPU is visible; its communicators start at first use."""
    if not (dist.is_nccl_available() and torch.cuda.is_available()):
        return None
    nccl_options = dist.ProcessGroupNCCL.Options()
    nccl_options._timeout = options.timeout
    nccl_options.global_ranks_in_group = options.global_ranks_in_group
    nccl_options.group_name = options.group_id
    store = dist.PrefixStore("nccl/", options.store)
    return dist.ProcessGroupNCCL(store, options.group_rank, options.group_size, nccl_options)
