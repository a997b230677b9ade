"""relay: a PrivateUse1 device served by torch-fallback, also reachable as ``torch.relay``.

``import torch_fallback.relay`` registers it (as ``import torch_openreg`` does
for PyTorch's reference backend): PrivateUse1 is renamed ``relay`` and this
module becomes its device module. relay tensors own memory on a *home*, host
memory ("cpu", the default) or a CUDA GPU's memory ("cuda"). relay implements
natively only what a backend must (allocation, resize, set_; views and copies
from torch-fallback's C++ API); every other op runs through the boxed fallback.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

import torch_fallback  # the library relay's extension resolves its fallback from

from .._scoped import scoped
from . import _C

NAME = "relay"
HOMES = ("cpu", "cuda")


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise: relay is ready once imported."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """relay:i keeps its GPU memory on cuda:i: one device per visible GPU, at least one."""
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device: int | str | torch.device) -> None:
    _C.set_device(_index(device))


def synchronize(device: int | str | torch.device | None = None) -> None:
    """Wait for relay work on the device's GPU; host-homed work is already done."""
    _C.synchronize(-1 if device is None else _index(device))


def get_home() -> str:
    """Home of new relay tensors: "cpu" (host memory) or "cuda" (GPU memory)."""
    return _C.get_home()


def set_home(home: str) -> None:
    """Set where new relay tensors keep their memory. A CUDA home without CUDA
    or without a GPU is an error at the first allocation."""
    _C.set_home(home)


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
    if device.type != NAME:
        raise ValueError(f"expected a relay device, got {device}")
    return current_device() if device.index is None else device.index


def _register() -> None:
    """Make relay a torch device; idempotent within a process."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    if not hasattr(torch, NAME):
        torch._register_device_module(NAME, sys.modules[__name__])
    if not hasattr(torch.Tensor, NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )


_register()
if "TORCH_FALLBACK_RELAY_HOME" in os.environ:
    set_home(os.environ["TORCH_FALLBACK_RELAY_HOME"].strip())

del torch_fallback
