"""tinydev as a device: its name, its memory, and where its c10::cuda calls go."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tinydev
import torch_fallback


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter, so that nothing this process imported is registered."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_tinydev_is_the_privateuse1_device():
    assert torch._C._get_privateuse1_backend_name() == "tinydev"
    assert torch.tinydev is tinydev
    assert torch.tinydev.device_count() == 2
    tensor = torch.ones(2, 3, device="tinydev")
    assert tensor.device == torch.device("tinydev", 0)
    assert tensor.is_tinydev
    assert tensor.untyped_storage().device.type == "tinydev"
    assert torch.zeros(2).tinydev().device.type == "tinydev"


def test_import_registers_tinydev_and_never_relay():
    result = run_python(
        """
        import sys
        import torch
        import torch_fallback
        print(torch._C._get_privateuse1_backend_name())
        import tinydev
        print(torch._C._get_privateuse1_backend_name())
        print("torch_fallback.relay" in sys.modules)
        print((torch.arange(4, device="tinydev") * 2).cpu().tolist())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == ["privateuseone", "tinydev", "False", "[0, 2, 4, 6]"]


def test_privateuse1_taken_by_another_backend_is_a_clear_import_error():
    result = run_python(
        """
        import torch
        torch.utils.rename_privateuse1_backend("otherdev")
        import tinydev
        """
    )
    assert result.returncode != 0
    assert "PrivateUse1 device is already 'otherdev'" in result.stderr


def test_allocations_are_tinydevs_own_and_freed():
    gc.collect()
    before = tinydev.live_allocations()
    tensor = torch.empty(1000, device="tinydev")
    assert tinydev.live_allocations() == before + 1
    del tensor
    gc.collect()
    assert tinydev.live_allocations() == before


def test_native_kernels_do_not_reach_the_fallback():
    torch_fallback.reset_metrics()
    tensor = torch.empty(6, device="tinydev")  # empty.memory_format: native
    strided = torch.empty_strided((2, 3), (1, 2), device="tinydev")  # native
    tensor.resize_(12)  # native
    tensor.view(3, 4).t()  # torch-fallback's view kernels
    assert strided.stride() == (1, 2)
    assert tensor.shape == (12,)
    assert torch_fallback.metrics() == {}


def test_resize_keeps_the_contents_and_grows():
    tensor = torch.arange(4.0, device="tinydev")
    tensor.resize_(2, 5)
    assert tensor.shape == (2, 5)
    assert tensor.flatten()[:4].cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    tensor.fill_(7.0)
    assert tensor.cpu().sum().item() == 70.0


def expected_cuda_symbols() -> set[str]:
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    set_device = "_ZN3c104cuda10set_deviceEa" + ("b" if (major, minor) >= (2, 8) else "")
    return {"_ZN3c104cuda14current_deviceEv", set_device, "_ZN3c104cuda18device_synchronizeEv"}


def test_c10_cuda_symbols_resolve_to_the_library_of_this_wheel_kind():
    providers = tinydev.cuda_symbol_providers()
    assert set(providers) == expected_cuda_symbols()
    for symbol, provider in providers.items():
        path = Path(provider)
        if torch.backends.cuda.is_built():
            assert path.name == "libc10_cuda.so", (symbol, provider)
        else:
            # torch-fallback's stub, from the installed wheel.
            assert path.name.startswith("_C_cuda_functions."), (symbol, provider)
            assert path.parent.resolve() == Path(torch_fallback.__file__).parent.resolve()


@pytest.mark.cuda_wheel
def test_cuda_wheel_never_loads_the_stub():
    maps = Path("/proc/self/maps").read_text()
    assert "_C_cuda_functions" not in maps
    assert "libc10_cuda.so" in maps


@pytest.mark.cpu_wheel
def test_cpu_wheel_calling_c10_cuda_raises_the_stubs_error():
    with pytest.raises(
        RuntimeError,
        match=r"c10::cuda::current_device\(\) is unavailable: this PyTorch .* "
        "was built without CUDA",
    ):
        tinydev.cuda_current_device()


@pytest.mark.requires_cuda
def test_gpu_calling_c10_cuda_reaches_libc10_cuda():
    assert tinydev.cuda_current_device() == torch.cuda.current_device()


def test_two_processes_all_reduce_tinydev_tensors_through_the_library(tmp_path):
    """torch_fallback.distributed serves any backend of the library: here gloo, on
    zero-copy views of tinydev's host memory."""
    code = f"""
        import sys, torch, torch.distributed as dist
        import tinydev
        rank = int(sys.argv[1])
        dist.init_process_group(init_method="file://{tmp_path}/store", rank=rank, world_size=2)
        x = torch.full((3,), float(rank + 1), device="tinydev")
        dist.all_reduce(x)
        out = [torch.empty(3, device="tinydev") for _ in range(2)]
        dist.all_gather(out, x)
        print(dist.get_backend_config(), x.cpu().tolist(), [o.device.type for o in out])
        dist.destroy_process_group()
    """
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for process in ranks:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        assert "tinydev:tinydevcc" in out and "[3.0, 3.0, 3.0]" in out, out
        assert "['tinydev', 'tinydev']" in out
