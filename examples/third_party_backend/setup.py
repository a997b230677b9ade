"""tinydev's extension, built against the installed torch and torch-fallback.

pip install --no-build-isolation .
"""

from setuptools import setup

try:
    from torch_fallback.cpp_extension import (
        ABI3_WHEEL_OPTIONS,
        BackendExtension,
        BuildExtension,
    )
except ImportError as error:  # pragma: no cover - depends on the build environment
    raise SystemExit(
        f"tinydev builds against the torch and torch-fallback installed in this environment, "
        f"and they cannot be imported ({error}). Install both first, then build without build "
        "isolation: pip install --no-build-isolation ."
    ) from error

# [readme:setup]
setup(
    ext_modules=[
        BackendExtension(
            "tinydev._C",
            ["csrc/tinydev.cpp", "csrc/memory.cpp", "csrc/module.cpp"],
            # -fno-plt: the unboxed kernels call into torch-fallback through the GOT
            extra_compile_args={
                "cxx": ["-O2", "-g0", "-fno-plt", "-Wall", "-Wno-unused-parameter"]
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    options=ABI3_WHEEL_OPTIONS,  # one cp310-abi3 wheel for every CPython from 3.10 on
)
# [/readme:setup]
