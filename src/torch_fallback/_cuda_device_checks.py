"""The ops whose CUDA kernels take every tensor on one device, from PyTorch's own list.

PyTorch generates its CUDA kernels' wrappers from native_functions.yaml (torchgen,
which ships with torch). Each wrapper checks that all the op's tensors are on one device
unless the op says ``device_check: NoCheck``: TensorIterator's ops, most of which take a
0-dim CPU tensor as a scalar, indexing, which takes CPU indices, the ``_foreach_`` ops. On
a CUDA target those kernels check their arguments themselves; on the CPU target every
tensor a kernel sees is a CPU tensor, so the fallback refuses, as CUDA would, a 0-dim CPU
tensor beside a backend's tensors where the op's CUDA kernel checks devices.

setup.py reads the list when it builds the extension (the torch it builds against is the
one the extension loads under) and records it in _build_info.json, which the loader hands
to the library: no import parses the operator list.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

_DISPATCH = re.compile(r"^  dispatch:\n((?:    .*\n?)+)", re.MULTILINE)
_CUDA_KERNEL = re.compile(r"^    [^:\n]*\bCUDA\b[^:\n]*:", re.MULTILINE)
_DELEGATE = re.compile(r"^  structured_delegate: (\S+)", re.MULTILINE)


def native_functions_yaml() -> Path | None:
    """torchgen's native_functions.yaml for the installed torch, if it ships one."""
    spec = importlib.util.find_spec("torchgen")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "packaged" / "ATen" / "native" / "native_functions.yaml"
    return path if path.is_file() else None


def parse_device_checked(text: str) -> list[str]:
    """The ops of a native_functions.yaml whose CUDA kernels check devices, as the
    dispatcher names them ("aten::equal", "aten::clamp.Tensor"): an op with a CUDA
    kernel of its own, or a structured op whose out= form has one, and no
    ``device_check: NoCheck``. Read with regular expressions, which take milliseconds
    where a YAML parse of the whole file takes a second."""
    entries: dict[str, tuple[bool, bool, str | None]] = {}
    for entry in text.split("\n- func: ")[1:]:
        name = entry[: entry.index("(")]
        dispatch = _DISPATCH.search(entry)
        delegate = _DELEGATE.search(entry)
        entries[name] = (
            "device_check: NoCheck" in entry,
            bool(dispatch and _CUDA_KERNEL.search(dispatch.group(1))),
            delegate.group(1) if delegate else None,
        )

    def has_cuda_kernel(name: str) -> bool:
        _, own, delegate = entries[name]
        return own or (delegate is not None and delegate in entries and entries[delegate][1])

    return sorted(
        f"aten::{name}"
        for name, (no_check, _, _) in entries.items()
        if not no_check and has_cuda_kernel(name)
    )


def device_checked_ops() -> list[str]:
    """The installed torch's ops whose CUDA kernels check devices; none where torch
    ships no native_functions.yaml (the fallback then takes 0-dim CPU tensors as
    scalars for every op)."""
    path = native_functions_yaml()
    return parse_device_checked(path.read_text()) if path is not None else []
