"""The two symbol-resolution paths of the c10::cuda functions, proven per wheel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from elftools.elf.elffile import ELFFile

import torch_fallback
from torch_fallback import diagnostics
from torch_fallback._extension import ops
from torch_fallback._loader import check_torch_version, mapped_files

PACKAGE_DIR = Path(torch_fallback.__file__).parent
C10_CUDA_PREFIX = "_ZN3c104cuda"


def shared_object(stem: str) -> Path:
    matches = sorted(PACKAGE_DIR.glob(f"{stem}.*.so")) + sorted(PACKAGE_DIR.glob(f"{stem}.so"))
    assert matches, f"no {stem} shared object in {PACKAGE_DIR}"
    return matches[0]


def dynamic_symbols(path: Path) -> tuple[set[str], set[str]]:
    """(undefined, defined) names of the ELF dynamic symbol table."""
    undefined, defined = set(), set()
    with path.open("rb") as stream:
        dynsym = ELFFile(stream).get_section_by_name(".dynsym")
        for symbol in dynsym.iter_symbols():
            if not symbol.name:
                continue
            (undefined if symbol["st_shndx"] == "SHN_UNDEF" else defined).add(symbol.name)
    return undefined, defined


def test_stub_defines_every_c10_cuda_symbol_that_C_leaves_undefined():
    undefined, _ = dynamic_symbols(shared_object("_C"))
    needed = {name for name in undefined if name.startswith(C10_CUDA_PREFIX)}
    _, stub_defines = dynamic_symbols(shared_object("_C_cuda_functions"))
    assert needed, "_C calls no c10::cuda function: the stub would have nothing to stand in for"
    assert needed == set(ops.cuda_symbol_names())
    assert needed <= stub_defines, f"stub lacks {sorted(needed - stub_defines)}"


def test_set_device_mangling_matches_the_torch_built_against():
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    expected = (
        "_ZN3c104cuda10set_deviceEab" if (major, minor) >= (2, 8) else "_ZN3c104cuda10set_deviceEa"
    )
    assert expected in ops.cuda_symbol_names()


@pytest.mark.cpu_wheel
def test_cpu_wheel_resolves_c10_cuda_to_the_stub():
    for name in ops.cuda_symbol_names():
        assert Path(ops.cuda_symbol_provider(name)).name.startswith("_C_cuda_functions"), name
    assert diagnostics.cuda_stub_loaded()


@pytest.mark.cpu_wheel
def test_cpu_wheel_stub_raises_its_clear_error():
    with pytest.raises(
        RuntimeError, match="built without CUDA, so the CUDA fallback target cannot run"
    ):
        ops.cuda_current_device_unchecked()


@pytest.mark.cuda_wheel
def test_cuda_wheel_resolves_c10_cuda_to_libc10_cuda_and_never_loads_the_stub():
    for name in ops.cuda_symbol_names():
        assert Path(ops.cuda_symbol_provider(name)).name == "libc10_cuda.so", name
    assert not diagnostics.cuda_stub_loaded()
    assert not any("_C_cuda_functions" in path.name for path in mapped_files())


@pytest.mark.cuda_wheel
def test_cuda_wheel_without_gpu_names_the_missing_gpu():
    if torch.cuda.device_count() > 0:
        pytest.skip("a GPU is visible here; this test is about a CUDA build without one")
    with pytest.raises(RuntimeError, match="no GPU is visible") as error:
        ops.cuda_current_device()
    assert "driver version is insufficient" not in str(error.value)


def test_info_reports_the_resolution_and_build(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "torch_fallback", "info", "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    info = json.loads(completed.stdout)
    assert info["torch_version"] == str(torch.__version__)
    assert info["cuda_built"] == torch.backends.cuda.is_built()
    providers = {Path(path).name.split(".")[0] for path in info["cuda_symbols"].values()}
    assert providers == (
        {"libc10_cuda"} if torch.backends.cuda.is_built() else {"_C_cuda_functions"}
    )
    assert info["cuda_stub_loaded"] == (not torch.backends.cuda.is_built())


def test_extension_built_for_another_torch_release_is_a_clear_import_error():
    with pytest.raises(ImportError) as error:
        check_torch_version({"torch_version": "2.99.0+cpu"}, running="2.13.0+cpu")
    message = str(error.value)
    assert "2.99.0+cpu" in message and "2.13.0+cpu" in message
    assert "pip install --no-build-isolation" in message


def test_same_release_other_variant_still_loads():
    check_torch_version({"torch_version": "2.13.0+cpu"}, running="2.13.0+cu130")
