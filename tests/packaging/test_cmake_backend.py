"""tinydev built with CMake (examples/third_party_backend/CMakeLists.txt) instead of setup.py:
find_package(Torch) from torch.utils.cmake_prefix_path, find_package(torch_fallback) from
torch_fallback.get_cmake_dir(), then tinydev's own tests on the module CMake built."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

import torch_fallback

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_backend"
# Development.SABIModule and python_add_library(... USE_SABI): CMake 3.26
CMAKE_MINIMUM = (3, 26)
# Left behind by a setuptools build of the example: the copy must build from its sources alone.
NOT_COPIED = ("build", "*.egg-info", "*.so", "__pycache__", ".pytest_cache", ".ruff_cache")
PROBE = "import tinydev._C; print(tinydev._C.__file__)"
CONFIGURE = "configuring tinydev with CMake"


def cmake_program() -> str:
    """The `cmake` package's CMake (the test dependency group installs it; its console
    script need not be on PATH in a cell's venv), else the one on PATH."""
    try:
        import cmake
    except ImportError:
        found = shutil.which("cmake")
    else:
        found = str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    if found is None:
        pytest.fail(
            "cmake is not installed: this test builds examples/third_party_backend with CMake. "
            "Install the test dependency group (pip install --group test), which has cmake, "
            "or pip install 'cmake>=3.27'"
        )
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    match = re.search(r"version (\d+)\.(\d+)", version.stdout)
    if match is None or (int(match[1]), int(match[2])) < CMAKE_MINIMUM:
        pytest.fail(
            f"{found} is too old ({version.stdout.strip() or version.stderr.strip()}): "
            "examples/third_party_backend/CMakeLists.txt needs CMake "
            f"{'.'.join(map(str, CMAKE_MINIMUM))} or later (pip install 'cmake>=3.27')"
        )
    return found


def ninja_program() -> str | None:
    """The ninja program: on PATH, else the `ninja` package's (its script lies in the
    environment's bin/, which a cell's run venv does not put on PATH)."""
    candidates = [shutil.which("ninja")]
    try:
        import ninja
    except ImportError:
        pass
    else:
        package = Path(ninja.__file__).resolve().parent
        candidates += [
            str(Path(getattr(ninja, "BIN_DIR", "")) / "ninja"),
            str(package / "data" / "bin" / "ninja"),
            str(package.parents[3] / "bin" / "ninja"),  # <prefix>/lib/pythonX.Y/site-packages
        ]
    for candidate in candidates:
        if candidate and Path(candidate).is_absolute() and Path(candidate).is_file():
            return candidate
    return None


def generator() -> list[str]:
    """Ninja where there is one, else Unix Makefiles."""
    found = ninja_program()
    if found is None:
        return ["-G", "Unix Makefiles"]
    return ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={found}"]


def run(command: list[str | Path], what: str, **popen: Any) -> str:
    """``command``'s output; a failure fails the test with it."""
    done = subprocess.run(
        [str(part) for part in command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )
    if done.returncode != 0:
        hint = ""
        if what == CONFIGURE and torch.version.cuda and "CUDA" in done.stdout:
            hint = (
                f"\nThis torch is a CUDA {torch.version.cuda} build, and its TorchConfig.cmake "
                "went looking for the CUDA toolkit: CMakeLists.txt defines torch::cudart "
                "before find_package(Torch) so that it does not (tinydev links no CUDA "
                "library); if that stopped working, this torch's CMake config needs the CUDA "
                "toolkit (nvcc, CUDA_HOME) to be found."
            )
        pytest.fail(
            f"{what} failed (exit status {done.returncode}):\n"
            f"$ {' '.join(map(str, command))}\n{done.stdout}{hint}"
        )
    return done.stdout


def needed_libraries(path: Path) -> list[str]:
    with path.open("rb") as handle:
        dynamic = ELFFile(handle).get_section_by_name(".dynamic")
        assert isinstance(dynamic, DynamicSection), path
        return [tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"]


PACKAGE_PROBE = """
cmake_minimum_required(VERSION 3.26)
project(probe LANGUAGES NONE)
find_package(torch_fallback ${WANTED} ${EXACT} QUIET)
if(TARGET torch_fallback::headers)
  get_target_property(include torch_fallback::headers INTERFACE_INCLUDE_DIRECTORIES)
  get_target_property(definitions torch_fallback::headers INTERFACE_COMPILE_DEFINITIONS)
endif()
message(STATUS "found=${torch_fallback_FOUND} version=${torch_fallback_VERSION}")
message(STATUS "include=${include} definitions=${definitions}")
"""


def probe_package(tmp_path: Path, *options: str) -> str:
    """Configure a project that only runs find_package(torch_fallback ...): no compiler."""
    (tmp_path / "probe").mkdir(exist_ok=True)
    (tmp_path / "probe" / "CMakeLists.txt").write_text(PACKAGE_PROBE, encoding="utf-8")
    build = tmp_path / "probe" / f"build-{len(list((tmp_path / 'probe').glob('build-*')))}"
    command = [cmake_program(), "-S", tmp_path / "probe", "-B", build, *generator(), *options]
    command.append(f"-DCMAKE_PREFIX_PATH={torch_fallback.get_cmake_dir()}")
    return run(command, "configuring a project that finds torch_fallback")


def test_find_package_gives_the_version_and_the_headers_target(tmp_path: Path) -> None:
    version = torch_fallback.__version__
    found = probe_package(tmp_path, f"-DWANTED={version}", "-DEXACT=EXACT")
    assert f"found=1 version={version}" in found
    include = Path(torch_fallback.get_include()).resolve()
    assert f"include={include} definitions=TORCH_API_INCLUDE_EXTENSION_H" in found
    # a later major version than the installed one is not found
    major = int(version.split(".")[0])
    assert "found=0 version=" in probe_package(tmp_path, f"-DWANTED={major + 1}.0")


def test_tinydev_built_with_cmake_passes_its_tests(tmp_path: Path) -> None:
    source = tmp_path / "third_party_backend"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns(*NOT_COPIED))
    build = tmp_path / "build"
    cmake = cmake_program()
    prefix_path = f"{torch.utils.cmake_prefix_path};{torch_fallback.get_cmake_dir()}"
    run(
        [
            *(cmake, "-S", source, "-B", build, *generator()),
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DCMAKE_PREFIX_PATH={prefix_path}",
        ],
        CONFIGURE,
    )
    run([cmake, "--build", build, "--parallel", "2"], "building tinydev with CMake")

    module = source / "src" / "tinydev" / "_C.abi3.so"
    assert module.is_file(), f"the build left no {module}"
    needed = needed_libraries(module)
    assert {"libc10.so", "libtorch_cpu.so"} <= set(needed), needed
    # Not libtorch_python (CPython's full API), no CUDA library, and not torch-fallback's
    # module: its API resolves at load time, after `import torch_fallback`.
    unwanted = [n for n in needed if "torch_python" in n or "cuda" in n or n.endswith(".abi3.so")]
    assert not unwanted, needed

    # The copy's src first, so `import tinydev` is the copy with the module CMake built.
    pythonpath = [str(source / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    probe = [sys.executable, "-c", PROBE]
    imported = run(probe, "importing the CMake-built tinydev", env=env, cwd=tmp_path)
    assert Path(imported.strip().splitlines()[-1]).resolve() == module.resolve(), imported

    tests = [sys.executable, "-m", "pytest", source / "tests", "-q", "-p", "no:cacheprovider"]
    run([*tests, "--rootdir", source], "tinydev's tests on its CMake build", env=env, cwd=source)
