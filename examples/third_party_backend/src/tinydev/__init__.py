"""tinydev: a PyTorch device, built on torch-fallback by a third party.

``import tinydev`` renames PyTorch's PrivateUse1 device to ``tinydev``:
``torch.ones(3, device="tinydev")``. Its tensors keep their bytes in host
memory. tinydev implements natively only its memory (``empty.memory_format``,
``empty_strided``, ``resize_``); views and copies come from torch-fallback's
kernels and every other op runs through torch-fallback's boxed fallback, on
its target (``torch_fallback.set_target("cpu" | "cuda" | "auto")``), counted
in ``torch_fallback.metrics()``.
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
    """One device, tinydev:0."""
    return 1


def current_device() -> int:
    return 0


def set_device(device: int | str | torch.device) -> None:
    index = device if isinstance(device, int) else torch.device(device).index
    if index not in (None, 0):
        raise ValueError(f"tinydev:{index} does not exist; there is one tinydev device, tinydev:0")


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
    """Storages tinydev's allocator made that are still alive."""
    return _ops.live_allocations()


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
