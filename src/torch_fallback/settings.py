"""Fallback settings: the target device, ops forced to the CPU, CUDA sync mode.

Each setting has an environment variable, read when torch_fallback is
imported, and a Python API. Settings are process-wide, not per thread, because
autograd runs backward ops on threads of its own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping

from ._extension import ops
from ._scoped import scoped

TARGETS = ("cpu", "cuda", "auto")
CUDA_SYNC_MODES = ("stream", "device")


def get_target() -> str:
    return ops.get_target()


def set_target(name: str) -> None:
    """Where ops without a backend kernel run: "cpu", "cuda" or "auto".

    auto picks CUDA when PyTorch was built with CUDA, a GPU is visible and the
    op has a CUDA kernel, and the CPU otherwise.
    """
    ops.set_target(name)


def target(name: str) -> contextlib.AbstractContextManager[None]:
    """``with torch_fallback.target("cuda"):`` sets the target inside the block."""
    return scoped(get_target, set_target, name)


def get_cpu_ops() -> list[str]:
    return ops.get_cpu_ops()


def set_cpu_ops(names: Iterable[str]) -> None:
    """Ops that always run on the CPU target: "aten::op" or "aten::op.overload"."""
    ops.set_cpu_ops(list(names))


def get_cuda_sync() -> str:
    return ops.get_cuda_sync()


def set_cuda_sync(mode: str) -> None:
    """ "stream": CUDA fallback results are used in the order of the current
    stream (default). "device": a full device synchronize after each op."""
    ops.set_cuda_sync(mode)


def apply_environment(environ: Mapping[str, str] = os.environ) -> None:
    """Apply the TORCH_FALLBACK_* variables that are set; a bad value raises ValueError."""
    if "TORCH_FALLBACK_TARGET" in environ:
        set_target(environ["TORCH_FALLBACK_TARGET"].strip())
    if "TORCH_FALLBACK_CPU_OPS" in environ:
        names = [name.strip() for name in environ["TORCH_FALLBACK_CPU_OPS"].split(",")]
        set_cpu_ops(name for name in names if name)
    if "TORCH_FALLBACK_CUDA_SYNC" in environ:
        set_cuda_sync(environ["TORCH_FALLBACK_CUDA_SYNC"].strip())
