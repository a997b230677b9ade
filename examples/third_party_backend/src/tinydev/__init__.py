"""tinydev: a PyTorch device, built on torch-fallback by a third party.

``import tinydev`` renames PyTorch's PrivateUse1 device to ``tinydev``:
``torch.ones(3, device="tinydev:1")``. It has the traits of PyTorch's reference
backend, torch_openreg: two devices; host memory that stays locked (PROT_NONE)
outside an access, with its own allocation table; its own view, ``_copy_from``
and attention-choice kernels; its own BackendMeta, which ``torch.save`` keeps.
Every other op runs through torch-fallback's boxed fallback, on its target
(``torch_fallback.set_target("cpu" | "cuda" | "auto")``), counted in
``torch_fallback.metrics()``.
"""

from __future__ import annotations

import sys

import torch

# [readme:import-order]
# Before the extension: it leaves torch-fallback's API and the c10::cuda
# functions undefined, and `import torch_fallback` puts both in the global
# symbol scope (c10::cuda from libc10_cuda.so, or from torch-fallback's stub
# on a CPU-only PyTorch).
import torch_fallback
import torch_fallback.distributed

# [/readme:import-order]

NAME = "tinydev"


def _check_privateuse1_is_free() -> None:
    # Checked before the extension loads: it registers kernels for PrivateUse1.
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", NAME):
        raise ImportError(
            f"tinydev cannot register: PyTorch's PrivateUse1 device is already {current!r}, and "
            "a process has one PrivateUse1 backend. Import tinydev in a process that does not "
            f"import the {current} backend."
        )


_check_privateuse1_is_free()

from . import _C  # noqa: E402, F401  (loads torch.ops.tinydev)

_ops = torch.ops.tinydev


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise: tinydev is ready once imported."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Two devices, tinydev:0 and tinydev:1."""
    return 2


def current_device() -> int:
    return _ops.current_device()


def _index(device: int | str | torch.device | None) -> int | None:
    if device is None or isinstance(device, int):
        return device
    return torch.device(device).index


def set_device(device: int | str | torch.device) -> None:
    if (index := _index(device)) is not None:
        _ops.set_device(index)  # IndexError for a device tinydev does not have


class device:
    """``with tinydev.device(1):`` makes tinydev:1 the current device (torch.load uses it)."""

    def __init__(self, device: int | str | torch.device | None) -> None:
        self.index = _index(device)
        self.previous = 0

    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index is not None:
            set_device(self.index)

    def __exit__(self, *exc_info: object) -> None:
        set_device(self.previous)


def synchronize(device: int | str | torch.device | None = None) -> None:
    """Host memory, synchronous work: nothing is ever pending."""


def manual_seed(seed: int) -> None:
    """Random ops run on the fallback's target and draw from its generator."""
    torch.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    # torch.manual_seed calls this for custom devices; the generators that
    # tinydev's random ops use are the CPU's and CUDA's, which it seeds itself.
    del seed


def live_allocations() -> int:
    """Allocations tinydev's allocator made that are still alive (its allocation table)."""
    return _ops.live_allocations()


def open_accesses() -> int:
    """Accesses open over tinydev's memory, which is locked (PROT_NONE) when none is."""
    return _ops.open_accesses()


def device_of(address: int) -> int:
    """The tinydev device whose allocation holds ``address``; -1 when tinydev made none there."""
    return _ops.device_of(address)


def own_kernel_calls(name: str) -> int:
    """Calls of tinydev's own kernel ``name``: view, as_strided, _reshape_alias, _copy_from or
    _fused_sdp_choice (the attention choice), which torch-fallback must leave in place."""
    return _ops.own_kernel_calls(name)


def set_meta(tensor: torch.Tensor, version: int) -> None:
    """Put tinydev's own BackendMeta (a version number) on ``tensor``; torch.save keeps it."""
    _ops.set_meta(tensor, version)


def meta_version(tensor: torch.Tensor) -> int:
    """The version in ``tensor``'s tinydev BackendMeta; 0 when it has none."""
    return _ops.meta_version(tensor)


def cuda_symbol_providers() -> dict[str, str]:
    """{mangled c10::cuda symbol: path of the shared object tinydev's calls are bound to}."""
    return _ops.cuda_symbol_providers()


def cuda_current_device() -> int:
    """c10::cuda::current_device(), called by tinydev with no check: on a CPU-only
    PyTorch it reaches torch-fallback's stub, which raises RuntimeError."""
    return _ops.cuda_current_device()


def _register() -> None:
    """Make tinydev a torch device; idempotent within a process."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    if not hasattr(torch, NAME):
        torch._register_device_module(NAME, sys.modules[__name__])
    if not hasattr(torch.Tensor, NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )


_register()
# torch.distributed: the library's c10d backend, "tinydevcc" (gloo for tinydev's host memory)
torch_fallback.distributed.register(NAME)
