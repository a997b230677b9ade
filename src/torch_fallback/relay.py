"""The relay device module, also reachable as ``torch.relay``.

relay is PyTorch's PrivateUse1 device renamed: a real device whose tensors own
memory on a *home*, host memory ("cpu", the default) or a CUDA GPU's memory
("cuda"). It has native kernels only for what a backend must have (allocation,
copies, resize, views, set_); every other op runs through torch-fallback's
boxed fallback.
"""

from __future__ import annotations

import contextlib

import torch

from ._loader import load_extension
from ._scoped import scoped

_C = load_extension()

HOMES = ("cpu", "cuda")


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise: relay is ready once torch_fallback is imported."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """relay:i keeps its GPU memory on cuda:i: one device per visible GPU, at least one."""
    return _C.relay_device_count()


def current_device() -> int:
    return _C.relay_current_device()


def set_device(device: int | str | torch.device) -> None:
    _C.relay_set_device(_index(device))


def synchronize(device: int | str | torch.device | None = None) -> None:
    """Wait for relay work on the device's GPU; host-homed work is already done."""
    _C.relay_synchronize(-1 if device is None else _index(device))


def get_home() -> str:
    """Home of new relay tensors: "cpu" (host memory) or "cuda" (GPU memory)."""
    return _C.relay_get_home()


def set_home(home: str) -> None:
    """Set where new relay tensors keep their memory. A CUDA home without CUDA
    or without a GPU is an error at the first allocation."""
    _C.relay_set_home(home)


def home(home: str) -> contextlib.AbstractContextManager[None]:
    """``with relay.home("cuda"):`` allocates on the GPU inside the block."""
    return scoped(get_home, set_home, home)


def manual_seed(seed: int) -> None:
    """Random ops run on the fallback target and draw from its generator."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    # torch.manual_seed calls this for custom devices; the CPU and CUDA
    # generators it seeds itself are the ones relay's random ops use.
    del seed


def _index(device: int | str | torch.device) -> int:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "relay":
        raise ValueError(f"expected a relay device, got {device}")
    return 0 if device.index is None else device.index
