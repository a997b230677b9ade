"""Version checks with packaging, one implementation for the host and for a cell.

The host checks the torch wheel a wheelhouse holds. Inside a cell, the job runs on
the image's bare Python (standard library only) and asks the cell's environment,
which has torch and packaging, through ``python -m fallback_matrix.versions``:

    python -m fallback_matrix.versions torch PIN CUDA|-   # the installed torch, checked
    python -m fallback_matrix.versions wheel WHEEL TORCH  # a wheel's torch requirement
Each prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version


def release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0': the part that fixes the C++ ABI."""
    return Version(version).public


def torch_matches(pin: str, version: str) -> bool:
    """Whether torch ``version`` is the pin: exactly when the pin has a label, else its release."""
    wanted, got = Version(pin), Version(version)
    return got == wanted if wanted.local is not None else got.public == wanted.public


def cuda_matches(expected: str | None, cuda: str | None) -> bool:
    """torch.version.cuda against a cell's CUDA major (None: a CPU-only build)."""
    if expected is None or cuda is None:
        return expected is None and cuda is None
    return Version(cuda).major == int(expected)


def torch_pins(wheel: Path) -> list[str]:
    """The specifiers of the ``torch`` requirements in a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), "")
        text = archive.read(name).decode("utf-8", errors="replace") if name else ""
    requirements = [
        Requirement(line.partition(":")[2].strip())
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    return [str(req.specifier) for req in requirements if req.name == "torch"]


def _torch(pin: str, cuda: str) -> dict[str, Any]:
    import torch

    lib = Path(torch.__file__).parent / "lib"
    expected = None if cuda == "-" else cuda
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "file": torch.__file__,
        "libraries": sorted(name for name in os.listdir(lib) if ".so" in name),
        "matches": torch_matches(pin, torch.__version__)
        and cuda_matches(expected, torch.version.cuda),
    }


def _wheel(wheel: str, torch_version: str) -> dict[str, Any]:
    pins, wanted = torch_pins(Path(wheel)), f"=={release(torch_version)}"
    return {"pins": pins, "wanted": f"torch{wanted}", "matches": pins == [wanted]}


def main(argv: Sequence[str]) -> int:
    commands = {"torch": _torch, "wheel": _wheel}
    if len(argv) != 3 or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(commands[argv[0]](argv[1], argv[2])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
