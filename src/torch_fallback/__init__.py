"""torch-fallback: a generalized boxed fallback for out-of-tree PyTorch backends.

Importing it loads the library (choosing how the c10::cuda symbols resolve)
and applies the TORCH_FALLBACK_* settings. It registers no device and changes
no torch global: a backend attaches the fallback through the C++ API
(headers in get_include(); for CMake, find_package(torch_fallback) from
get_cmake_dir()), and `import torch_fallback.relay` registers the demo device
relay.
"""

from __future__ import annotations

from pathlib import Path

import torch  # noqa: F401  (loads libtorch before the extension)

from ._extension import _C  # noqa: F401
from .metrics import OpMetrics, metrics, metrics_report, reset_metrics
from .settings import (
    apply_environment,
    get_cpu_ops,
    get_cuda_sync,
    get_target,
    set_cpu_ops,
    set_cuda_sync,
    set_target,
    target,
)

apply_environment()

# The one place the version is written: setup.py reads it from this line.
__version__ = "0.1.0"


def get_include() -> str:
    """The directory of torch-fallback's C++ headers (#include <torch_fallback/fallback.h>)."""
    return str(Path(__file__).parent / "include")


def get_cmake_dir() -> str:
    """The directory of torch-fallback's CMake package (torch_fallbackConfig.cmake): put it
    on CMAKE_PREFIX_PATH for find_package(torch_fallback), which defines the target
    torch_fallback::headers."""
    return str(Path(__file__).parent / "share" / "cmake" / "torch_fallback")


__all__ = [
    "OpMetrics",
    "get_cmake_dir",
    "get_cpu_ops",
    "get_cuda_sync",
    "get_include",
    "get_target",
    "metrics",
    "metrics_report",
    "reset_metrics",
    "set_cpu_ops",
    "set_cuda_sync",
    "set_target",
    "target",
]
