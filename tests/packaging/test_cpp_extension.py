"""torch_fallback.cpp_extension: what a backend's setup.py gets (no compiler needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from setuptools import Extension

import torch_fallback
from torch_fallback.cpp_extension import (
    HEADERS,
    BackendExtension,
    check_headers,
    get_cmake_dir,
    include_dir,
)


def test_include_dir_holds_every_public_header():
    directory = include_dir()
    assert directory == Path(torch_fallback.get_include()).resolve()
    for name in HEADERS:
        assert (directory / "torch_fallback" / name).is_file(), name
    root = directory / "torch_fallback"
    shipped = {path.relative_to(root).as_posix() for path in root.rglob("*.h")}
    assert shipped == set(HEADERS)


def test_backend_extension_adds_the_include_dir_after_the_backends_own():
    extension = BackendExtension(
        "my_backend._C",
        [Path("csrc/my_backend.cpp")],
        include_dirs=["csrc"],
        extra_compile_args={"cxx": ["-O2"]},
    )
    assert isinstance(extension, Extension)
    assert extension.name == "my_backend._C"
    assert extension.sources == ["csrc/my_backend.cpp"]
    assert extension.language == "c++"
    assert extension.include_dirs[0] == "csrc"
    assert str(include_dir()) in extension.include_dirs
    assert extension.extra_compile_args == {"cxx": ["-O2"]}
    # CppExtension's own: torch's headers and libraries, but no CUDA library
    # and nothing of torch-fallback to link: those resolve at load time.
    assert any(Path(path, "torch", "library.h").is_file() for path in extension.include_dirs)
    assert "c10" in extension.libraries
    assert not any("cuda" in library for library in extension.libraries)
    # The stable ABI by default: no libtorch_python, whose API is CPython's full one.
    assert extension.py_limited_api
    assert "torch_python" not in extension.libraries


def test_a_backend_that_needs_pybind11_can_leave_the_stable_abi():
    extension = BackendExtension("my_backend._C", ["csrc/my_backend.cpp"], py_limited_api=False)
    assert not extension.py_limited_api
    assert "torch_python" in extension.libraries


def test_missing_headers_are_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no public C\\+\\+ API"):
        check_headers(tmp_path)


def test_the_cmake_package_lies_beside_the_headers():
    directory = Path(torch_fallback.get_cmake_dir())
    assert get_cmake_dir is torch_fallback.get_cmake_dir
    config = directory / "torch_fallbackConfig.cmake"
    assert config.is_file() and (directory / "torch_fallbackConfigVersion.cmake").is_file()
    # The config finds the headers three directories up, and checks the ones HEADERS lists.
    assert (directory / "../../../include").resolve() == include_dir()
    listed = re.search(r"foreach\(_torch_fallback_header IN ITEMS([^)]*)\)", config.read_text())
    assert listed is not None
    assert set(listed[1].split()) == set(HEADERS)


def test_the_cmake_package_reads_its_version_from_the_package():
    """No second version string: the version file reads __version__ from __init__.py."""
    directory = Path(torch_fallback.get_cmake_dir())
    version_file = (directory / "torch_fallbackConfigVersion.cmake").read_text()
    assert '"${CMAKE_CURRENT_LIST_DIR}/../../../__init__.py"' in version_file
    init = (directory / "../../../__init__.py").resolve()
    assert init == Path(torch_fallback.__file__).resolve()
    assert f'\n__version__ = "{torch_fallback.__version__}"\n' in init.read_text()
