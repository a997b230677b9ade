"""Every extension module is built on CPython's stable ABI: one wheel serves every Python."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

import torch_fallback
import torch_fallback.relay  # registers torch.ops.relay

PACKAGE_DIR = Path(torch_fallback.__file__).parent
MODULES = ["_C", "_C_cuda_functions", "relay/_C"]


def extension_file(module: str) -> Path:
    matches = sorted(PACKAGE_DIR.glob(f"{module}.*so"))
    assert len(matches) == 1, f"expected one shared object for {module} in {PACKAGE_DIR}: {matches}"
    return matches[0]


def elf(path: Path) -> tuple[set[str], set[str]]:
    """(NEEDED libraries, undefined dynamic symbols) of a shared object."""
    with path.open("rb") as stream:
        elf_file = ELFFile(stream)
        needed = {
            tag.needed
            for section in elf_file.iter_sections()
            if isinstance(section, DynamicSection)
            for tag in section.iter_tags()
            if tag.entry.d_tag == "DT_NEEDED"
        }
        symbols = elf_file.get_section_by_name(".dynsym")
        undefined = {
            symbol.name
            for symbol in symbols.iter_symbols()
            if symbol.name and symbol["st_shndx"] == "SHN_UNDEF"
        }
    return needed, undefined


@pytest.mark.parametrize("module", MODULES)
def test_the_module_is_tagged_abi3(module):
    assert extension_file(module).name.endswith(".abi3.so")


@pytest.mark.parametrize("module", MODULES)
def test_the_module_needs_no_python_binding_library(module):
    needed, undefined = elf(extension_file(module))
    assert not any(name.startswith("libtorch_python") for name in needed), needed
    assert not any("pybind11" in name for name in undefined)
    assert not any(name.startswith("THP") for name in undefined)  # torch's Python objects


@pytest.mark.parametrize("module", MODULES)
def test_the_module_uses_only_stable_cpython_functions(module):
    # The stable ABI's functions the modules need: creating the (empty) module.
    _, undefined = elf(extension_file(module))
    python_symbols = {name for name in undefined if name.startswith(("Py", "_Py"))}
    assert python_symbols <= {"PyModule_Create2"}, python_symbols


def test_the_library_functions_are_operators():
    assert torch.ops.torch_fallback.get_target() in {"cpu", "cuda", "auto"}
    assert torch.ops.relay.device_count() >= 1
    assert sys.modules["torch_fallback._C"].__doc__
