"""Build a backend's extension against torch-fallback's public C++ API.

Beside ``torch.utils.cpp_extension``: a backend's ``setup.py`` writes

    from setuptools import setup
    from torch_fallback.cpp_extension import BackendExtension, BuildExtension

    setup(
        ext_modules=[BackendExtension("my_backend._C", ["csrc/my_backend.cpp"])],
        cmdclass={"build_ext": BuildExtension},
        options=ABI3_WHEEL_OPTIONS,
    )

and builds with ``pip install --no-build-isolation .`` in the environment where
torch and torch-fallback are installed (build isolation would compile against
another torch, whose C++ ABI the installed wheels do not share).

The extension links against neither torch-fallback nor a CUDA library. It
leaves two kinds of symbols undefined, and the dynamic loader finds both in
the global scope that ``import torch_fallback`` prepares:

- torch-fallback's API (``torch_fallback::boxed_fallback``, ...): exported by
  ``torch_fallback._C``, loaded with RTLD_GLOBAL;
- the ``c10::cuda`` functions a backend may declare through
  ``<torch_fallback/cuda_functions.h>``: from ``libc10_cuda.so`` on a CUDA
  build of PyTorch, from torch-fallback's stub library (whose functions raise
  a clear error) on a CPU-only build.

So the backend's Python package must ``import torch_fallback`` before it
imports its extension; otherwise loading it fails with "undefined symbol".

The extension is built on CPython's stable ABI (``py_limited_api=True``), as
PyTorch's custom-operator guide does: its functions are operators
(``TORCH_LIBRARY``, called as ``torch.ops.my_backend.*``) and its module is the
empty one ``TORCH_FALLBACK_PYTHON_MODULE`` (``<torch_fallback/python_module.h>``)
defines. With ``options=ABI3_WHEEL_OPTIONS`` the wheel is tagged ``cp310-abi3``:
one file for every CPython from 3.10 on. A backend that needs pybind11 passes
``py_limited_api=False`` and builds one wheel per Python.

A backend built with CMake instead finds the same API as a CMake package:
``find_package(torch_fallback)`` with ``get_cmake_dir()`` on ``CMAKE_PREFIX_PATH``
gives the target ``torch_fallback::headers`` (examples/third_party_backend's
CMakeLists.txt builds tinydev so).

Importing this module imports torch_fallback, which refuses (ImportError) a
torch other than the one its wheel was built against: a backend is never
compiled against a mismatched pair.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from os import PathLike
from pathlib import Path
from typing import Any

from setuptools import Extension
from torch.utils.cpp_extension import BuildExtension, CppExtension

from . import get_cmake_dir, get_include

HEADERS = (
    "api.h",
    "fallback.h",
    "kernels.h",
    "cuda.h",
    "cuda_functions.h",
    "python_module.h",
    "detail/direct_kernel.h",
)
# setup(options=...): tag the wheel for CPython's stable ABI from 3.10 on.
ABI3_WHEEL_OPTIONS = {"bdist_wheel": {"py_limited_api": "cp310"}}


def include_dir() -> Path:
    """The directory to put on the include path: ``#include <torch_fallback/fallback.h>``."""
    return Path(get_include()).resolve()


def check_headers(directory: Path | None = None) -> Path:
    """The include directory, after checking that it holds every public header."""
    directory = include_dir() if directory is None else directory
    missing = [name for name in HEADERS if not (directory / "torch_fallback" / name).is_file()]
    if missing:
        raise FileNotFoundError(
            f"torch-fallback's C++ headers {missing} are missing from {directory}: this "
            "installation has no public C++ API. Reinstall torch-fallback from a wheel built "
            "by its setup.py (the wheel ships include/torch_fallback/*.h)."
        )
    return directory


def BackendExtension(
    name: str,
    sources: Sequence[str | PathLike[str]],
    *,
    include_dirs: Iterable[str | PathLike[str]] = (),
    py_limited_api: bool = True,
    **kwargs: Any,
) -> Extension:
    """A ``torch.utils.cpp_extension.CppExtension`` for a backend built on torch-fallback.

    ``name`` is the extension's full module name (``"my_backend._C"``), and
    ``sources`` its C++ files. torch-fallback's include directory is added
    after ``include_dirs``; ``py_limited_api`` (stable ABI, no libtorch_python)
    is on unless turned off; every other keyword goes to ``CppExtension``
    unchanged (``extra_compile_args``, ``define_macros``, ...). Build it with
    ``BuildExtension`` (re-exported here).
    """
    return CppExtension(
        name,
        [str(source) for source in sources],
        include_dirs=[*(str(path) for path in include_dirs), str(check_headers())],
        py_limited_api=py_limited_api,
        **kwargs,
    )


__all__ = [
    "ABI3_WHEEL_OPTIONS",
    "HEADERS",
    "BackendExtension",
    "BuildExtension",
    "check_headers",
    "get_cmake_dir",
    "include_dir",
]
