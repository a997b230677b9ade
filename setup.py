"""Build of torch-fallback's shared libraries against the installed torch.

Build with no build isolation, in the environment whose torch you will run:
    pip wheel --no-build-isolation --no-deps -w dist .

The source distribution needs no torch (python -m build --sdist); building a
wheel from it without torch stops at once with what to do instead.
"""

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from setuptools import setup

# What needs no compiler and no torch: the source distribution and its metadata.
SOURCE_ONLY_COMMANDS = {"sdist", "egg_info"}

try:
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as error:  # pragma: no cover - depends on the build environment
    if sys.argv[1:2] and sys.argv[1] not in SOURCE_ONLY_COMMANDS:
        raise SystemExit(
            "torch-fallback compiles against the torch installed in this environment, and torch "
            f"cannot be imported ({error}); pip's build isolation hides it. Install the torch "
            "you will run first, then torch-fallback without build isolation:\n"
            "    pip install torch\n"
            "    pip install --no-build-isolation torch-fallback"
        ) from error
    torch = None

PACKAGE = Path("src/torch_fallback")
CSRC = PACKAGE / "csrc"
RELAY_CSRC = PACKAGE / "relay" / "csrc"
BUILD_INFO = "_build_info.json"
# -fno-plt: a fallback call reaches some forty functions of libtorch and of the
# library; through the GOT each costs one indirect call, where a PLT stub adds a
# jump and an instruction-cache line of its own (benchmarks/README.md, A call
# inside a model). -fno-semantic-interposition: the library's exported functions
# call each other directly, not through the GOT (nothing interposes them).
CXX_FLAGS = [
    "-O2",
    "-g0",
    "-fvisibility=hidden",
    "-fno-plt",
    "-fno-semantic-interposition",
    "-Wall",
    "-Wno-unused-parameter",
]
LINK_FLAGS: list[str] = []

# TORCH_FALLBACK_SANITIZE=address builds with AddressSanitizer; run the result
# with LD_PRELOAD=$(g++ -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0.
if os.environ.get("TORCH_FALLBACK_SANITIZE"):
    sanitizer = f"-fsanitize={os.environ['TORCH_FALLBACK_SANITIZE']}"
    CXX_FLAGS = [
        sanitizer,
        "-O1",
        "-g",
        "-fno-omit-frame-pointer",
        "-Wall",
        "-Wno-unused-parameter",
    ]
    LINK_FLAGS = [sanitizer]


def sources(directory: Path, *names: str) -> list[str]:
    return [str(directory / name) for name in names]


def build_info() -> dict:
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
    }


def cuda_device_checked_ops() -> list[str]:
    """The ops whose CUDA kernels check devices, read from the torch built against
    (recorded with the build, so that no import parses PyTorch's operator list). The
    reader lives in the package, which cannot be imported before it is built."""
    path = PACKAGE / "_cuda_device_checks.py"
    spec = importlib.util.spec_from_file_location("_cuda_device_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.device_checked_ops()


def build_command() -> type:
    class BuildWithInfo(BuildExtension):
        """Compiles the extensions and records which torch they were built against.

        torch_fallback reads the record before it loads _C, so that a torch other
        than the one built against gives a clear ImportError instead of an
        undefined-symbol error from the dynamic loader.
        """

        def run(self) -> None:
            super().run()
            package_dir = Path(self.get_ext_fullpath("torch_fallback._C")).parent
            info = {**build_info(), "cuda_device_checked_ops": cuda_device_checked_ops()}
            (package_dir / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")

    return BuildWithInfo


def version_macros() -> list[tuple[str, str]]:
    info = build_info()
    return [
        ("TORCH_FALLBACK_BUILT_TORCH", json.dumps(info["torch_version"])),
        ("TORCH_FALLBACK_BUILT_CUDA", json.dumps(info["cuda_version"] or "")),
    ]


# Absolute: ninja compiles from the build directory.
PUBLIC_INCLUDE = str((PACKAGE / "include").resolve())

# Every extension uses only the CPython stable ABI (Python calls it through
# torch.ops), so one wheel, tagged cp310-abi3, serves CPython 3.10 and later;
# py_limited_api=True also makes torch's BuildExtension define Py_LIMITED_API
# and leaves libtorch_python unlinked.
PYTHON_ABI = "cp310"


def extensions() -> list:
    return [
        # The library: the boxed fallback, its settings and metrics, and the
        # public C++ API (include/torch_fallback) that backends build against.
        CppExtension(
            "torch_fallback._C",
            sources(
                CSRC,
                "bindings.cpp",
                "cuda.cpp",
                "settings.cpp",
                "metrics.cpp",
                "op_rules.cpp",
                "decompositions.cpp",
                "native_kernels.cpp",
                "batch_norm.cpp",
                "call_support.cpp",
                "boxed_call.cpp",
                "direct_call.cpp",
                "distributed.cpp",
            ),
            include_dirs=[PUBLIC_INCLUDE],
            define_macros=version_macros(),
            extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=LINK_FLAGS,
            py_limited_api=True,
        ),
        # The c10::cuda stand-ins, loaded only on a PyTorch built without CUDA.
        CppExtension(
            "torch_fallback._C_cuda_functions",
            sources(CSRC, "cuda_functions_stub.cpp"),
            include_dirs=[PUBLIC_INCLUDE],
            extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=LINK_FLAGS,
            py_limited_api=True,
        ),
        # relay, the first client: built only on the public API, like any backend.
        CppExtension(
            "torch_fallback.relay._C",
            sources(
                RELAY_CSRC,
                "storage.cpp",
                "device.cpp",
                "generator.cpp",
                "autocast.cpp",
                "kernels.cpp",
                "module.cpp",
            ),
            include_dirs=[PUBLIC_INCLUDE],
            extra_compile_args={"cxx": CXX_FLAGS},
            extra_link_args=LINK_FLAGS,
            py_limited_api=True,
        ),
    ]


# --- distribution metadata: the torch pin and the build label (kept apart from the build) ---

# Written once, as the package's __version__; read from the file, as importing the package
# would load the extension this builds.
VERSION = re.search(
    r'^__version__ = "([^"]+)"$', (PACKAGE / "__init__.py").read_text(), re.MULTILINE
)[1]


def distribution_metadata() -> dict:
    """The version and the torch requirement of this build.

    The extension only loads under the torch release it was compiled against, so
    the wheel requires exactly that release. Builds for different torch builds
    differ in their local version label, e.g. 0.1.0+pt2130cpu and 0.1.0+pt2141cu130
    (for package indexes that serve variants side by side, as PyTorch's own do);
    TORCH_FALLBACK_PLAIN_VERSION=1 leaves the label out for the one build that
    goes to PyPI, which rejects local labels.
    """
    release = torch.__version__.split("+", 1)[0]
    variant = f"cu{torch.version.cuda.replace('.', '')}" if torch.version.cuda else "cpu"
    label = f"pt{release.replace('.', '')}{variant}"
    plain = os.environ.get("TORCH_FALLBACK_PLAIN_VERSION", "").strip() in {"1", "true", "yes"}
    return {
        "version": VERSION if plain else f"{VERSION}+{label}",
        "install_requires": [f"torch=={release}"],
    }


if torch is None:  # the source distribution: its metadata, nothing to compile
    setup(version=VERSION, install_requires=["torch"])
else:
    setup(
        ext_modules=extensions(),
        cmdclass={"build_ext": build_command()},
        options={"bdist_wheel": {"py_limited_api": PYTHON_ABI}},
        **distribution_metadata(),
    )
