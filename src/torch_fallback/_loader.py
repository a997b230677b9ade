"""Loads the compiled libraries in the order symbol resolution needs.

_C calls c10::cuda functions that only CUDA builds of PyTorch define (in
libc10_cuda.so). On a PyTorch built without CUDA, the stub library
_C_cuda_functions defines them instead; it is loaded with RTLD_GLOBAL before
_C, so that the dynamic loader binds _C's undefined symbols to it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from importlib import resources
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


def load_cuda_stub() -> ModuleType:
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)
    try:
        return importlib.import_module(f"{__package__}._C_cuda_functions")
    finally:
        sys.setdlopenflags(flags)


def load_extension() -> ModuleType:
    check_torch_version(read_build_info())
    if not torch_built_with_cuda():
        load_cuda_stub()
    return importlib.import_module(f"{__package__}._C")
