"""tinydev's torch_openreg traits, each something torch-fallback must not break: locked
memory, its allocation table, its own kernels, its own BackendMeta, two devices."""

from __future__ import annotations

import gc
import io
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from test_tinydev_device import run_python
from torch.testing import assert_close

import tinydev
import torch_fallback

TARGETS = [
    pytest.param("cpu", id="target-cpu"),
    pytest.param("cuda", id="target-cuda", marks=pytest.mark.requires_cuda),
]


# tinydev:1's ops run on cuda:1 under the CUDA target
TARGETS_OF_TWO_DEVICES = [
    pytest.param("cpu", id="target-cpu"),
    pytest.param(
        "cuda", id="target-cuda", marks=[pytest.mark.requires_cuda, pytest.mark.requires_two_gpus]
    ),
]


@pytest.fixture(params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[str]:
    with torch_fallback.target(request.param):
        yield request.param


@pytest.fixture(params=TARGETS_OF_TWO_DEVICES)
def target_of_two(request: pytest.FixtureRequest) -> Iterator[str]:
    with torch_fallback.target(request.param):
        yield request.param


def a_training_step(device: str) -> list[torch.Tensor]:
    """A few steps of a small model with Adam: views, out=, in-place and _foreach_ ops."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    data = torch.randn(4, 8).to(device)
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(data).square().mean()
        loss.backward()
        optimizer.step()
    return [parameter.detach() for parameter in model.parameters()]


def test_memory_is_locked_outside_an_access():
    # Reading a tinydev tensor's bytes from outside an access faults, as on torch_openreg.
    result = run_python(
        """
        import ctypes
        import tinydev, torch
        tensor = torch.ones(4, device="tinydev")
        print((tensor + 1).cpu().tolist(), flush=True)  # through the fallback: fine
        ctypes.c_float.from_address(tensor.data_ptr()).value  # no access open
        print("read locked memory")
        """
    )
    assert result.stdout.splitlines()[0] == "[2.0, 2.0, 2.0, 2.0]", result.stderr
    assert "read locked memory" not in result.stdout
    assert result.returncode == -11  # SIGSEGV


def test_every_access_the_library_opens_is_closed(target):
    before = a_training_step("cpu")
    after = a_training_step("tinydev")
    x = torch.arange(24.0).reshape(4, 6).to("tinydev")
    torch.add(x, 1, out=torch.empty(0, device="tinydev"))  # out= resized
    x[1:3, ::2].mul_(2)  # in place on a view
    _ = x[torch.tensor([0, 3])].sum().item()  # indexing, a scalar to the host
    _ = x.clone().to(torch.float64).cumsum(0)  # a lazy clone, a cast
    gc.collect()
    assert tinydev.open_accesses() == 0
    for expected, actual in zip(before, after, strict=True):
        assert_close(actual.cpu(), expected)


def test_results_are_in_tinydevs_allocation_table(target_of_two):
    x = torch.randn(64, 64).to("tinydev:1")
    results = [x @ x, torch.sin(x), x.sum(dim=0), torch.cat([x, x]), x.t().contiguous()]
    for result in results:
        assert result.device == torch.device("tinydev", 1)
        assert tinydev.device_of(result.data_ptr()) == 1
        assert result.untyped_storage().data_ptr() == result.data_ptr() - (
            result.storage_offset() * result.element_size()
        )
    assert tinydev.device_of(torch.ones(3).data_ptr()) == -1  # CPU memory is not tinydev's


def own_calls() -> dict[str, int]:
    names = ("view", "as_strided", "_reshape_alias", "_copy_from", "_fused_sdp_choice")
    return {name: tinydev.own_kernel_calls(name) for name in names}


def test_tinydevs_own_kernels_stay_in_place():
    before = own_calls()
    x = torch.arange(12.0).to("tinydev")  # _copy_from
    x.view(3, 4)
    x.as_strided((2, 2), (1, 2))
    x.cpu()  # _copy_from
    after = own_calls()
    assert {name: after[name] - before[name] for name in before} == {
        "view": 1,
        "as_strided": 1,
        "_reshape_alias": 0,
        "_copy_from": 2,
        "_fused_sdp_choice": 0,
    }


def test_attention_uses_tinydevs_own_choice(target):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    before = tinydev.own_kernel_calls("_fused_sdp_choice")
    actual = F.scaled_dot_product_attention(
        q.to("tinydev"), k.to("tinydev"), v.to("tinydev"), is_causal=True
    )
    assert tinydev.own_kernel_calls("_fused_sdp_choice") == before + 1
    assert_close(actual.cpu(), expected)


def test_backend_meta_is_tinydevs_and_survives_save_and_load():
    tensor = torch.arange(6.0).to("tinydev")
    tinydev.set_meta(tensor, 3)
    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.device.type == "tinydev"
    assert tinydev.meta_version(loaded) == 3
    assert_close(loaded.cpu(), torch.arange(6.0))


def test_the_library_puts_nothing_in_backend_meta(target):
    # Optimizer steps are where the library would keep per-tensor state; tinydev's
    # serialization hook takes any BackendMeta for its own, so saving them must work.
    parameters = a_training_step("tinydev")
    assert [tinydev.meta_version(parameter) for parameter in parameters] == [0] * 4
    buffer = io.BytesIO()
    torch.save(parameters, buffer)
    buffer.seek(0)
    for saved, loaded in zip(parameters, torch.load(buffer), strict=True):
        assert_close(loaded.cpu(), saved.cpu())


def test_two_devices(target_of_two):
    assert tinydev.device_count() == 2
    a = torch.arange(6.0).to("tinydev:0")
    b = a.to("tinydev:1")  # tinydev's own _copy_from, across devices
    assert (a.device.index, b.device.index) == (0, 1)
    assert ((b * 2).device, (b + b).sum().device) == (b.device, b.device)
    assert_close((b * 2).cpu(), torch.arange(6.0) * 2)
    with torch.device("tinydev:1"):
        assert torch.ones(2).device == torch.device("tinydev", 1)
    tinydev.set_device(1)
    try:
        assert torch.empty(2, device="tinydev").device == torch.device("tinydev", 1)
    finally:
        tinydev.set_device(0)
    with pytest.raises(IndexError, match="tinydev:2 does not exist"):
        torch.empty(2, device="tinydev:2")
