"""Loads the compiled libraries in the order symbol resolution needs.

_C calls c10::cuda functions that only CUDA builds of PyTorch define (in
libc10_cuda.so), and leaves them undefined: _C links no CUDA library, so one
binary serves both kinds of wheel. Before _C loads, one definition of them is
put into the global symbol scope:

- PyTorch built with CUDA: libc10_cuda.so, which `import torch` loaded
  privately (RTLD_LOCAL), is promoted to RTLD_GLOBAL.
- PyTorch built without CUDA: the stub library _C_cuda_functions is loaded
  with RTLD_GLOBAL; its functions raise a clear error.

_C itself is loaded with RTLD_GLOBAL too: its public C++ API (the boxed
fallback, include/torch_fallback) is then visible to the extensions of
backends, which load after `import torch_fallback` and leave those symbols
undefined, as they leave torch's.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import sys
from importlib import resources
from pathlib import Path
from types import ModuleType

import torch

BUILD_INFO = "_build_info.json"
REBUILD_HINT = (
    "Rebuild torch-fallback in this environment, against the torch it runs: "
    "pip install --no-build-isolation --no-deps --force-reinstall <torch-fallback source>"
)


def torch_built_with_cuda() -> bool:
    """Whether PyTorch was BUILT with CUDA, GPU or not.

    Not torch.cuda.is_available(): on a CUDA build without a visible GPU that
    is False, and loading the stub globally there would let it win symbol
    lookup over libc10_cuda.so.
    """
    return torch.backends.cuda.is_built()


def release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0': the part that fixes the C++ ABI."""
    return str(version).split("+", 1)[0]


def read_build_info() -> dict:
    try:
        text = resources.files(__package__).joinpath(BUILD_INFO).read_text()
    except FileNotFoundError as error:
        raise ImportError(
            f"torch_fallback is not built: {BUILD_INFO} is missing next to its package. "
            + REBUILD_HINT
        ) from error
    return json.loads(text)


def check_torch_version(build_info: dict, running: str | None = None) -> None:
    """Raise a clear ImportError when _C was built for another torch release."""
    running = str(running or torch.__version__)
    built = build_info["torch_version"]
    if release(built) != release(running):
        raise ImportError(
            f"torch_fallback's extension was built against torch {built}, but torch {running} "
            f"is installed; a C++ extension only loads under the torch release it was built "
            f"against. {REBUILD_HINT}"
        )


def mapped_files() -> list[Path]:
    """The files mapped into this process (shared objects among them), from /proc/self/maps."""
    paths = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/"):
            paths.add(Path(fields[5]))
    return sorted(paths)


def loaded_library(name: str) -> Path | None:
    """Path of the loaded shared object called `name`."""
    return next((path for path in mapped_files() if path.name == name), None)


def promote_libc10_cuda() -> None:
    path = loaded_library("libc10_cuda.so")
    if path is None:
        raise ImportError(
            f"torch {torch.__version__} was built with CUDA, but libc10_cuda.so is not loaded "
            "after `import torch`; this PyTorch installation looks broken. Reinstall torch."
        )
    # Already loaded: RTLD_NOLOAD only changes its scope to global.
    ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)


def import_global(name: str) -> ModuleType:
    """Import an extension module with its symbols in the global scope."""
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)
    try:
        return importlib.import_module(name)
    finally:
        sys.setdlopenflags(flags)


def load_extension() -> ModuleType:
    build_info = read_build_info()
    check_torch_version(build_info)
    if torch_built_with_cuda():
        promote_libc10_cuda()
    else:
        import_global(f"{__package__}._C_cuda_functions")
    extension = import_global(f"{__package__}._C")
    # Before any op's rules are made: which ops take no 0-dim CPU tensor as a scalar.
    torch.ops.torch_fallback.set_cuda_device_checked_ops(build_info["cuda_device_checked_ops"])
    return extension
