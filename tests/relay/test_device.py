"""relay as a device: the everyday surface that user code and PyTorch itself expect.

Checkpoints, pickling, seeding, autocast, activation checkpointing, indexing
with CPU indices, pinned memory, torch.compile and sparse layouts, for every
placement (the CUDA ones need a GPU).
"""

from __future__ import annotations

import copy
import io
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import compile_cases
import pytest
import torch
import torch.utils.checkpoint

import torch_fallback.relay as relay

pytestmark = pytest.mark.usefixtures("placement")


def reference_device(placement) -> str:
    return "cuda" if placement.target == "cuda" else "cpu"


# Devices.


def test_device_indices_are_bounds_checked(placement):
    for bad in (relay.device_count(), 256):
        with pytest.raises(IndexError, match=r"relay:\d+ does not exist"):
            relay.set_device(bad)
    assert relay.current_device() == 0
    with pytest.raises(IndexError, match="does not exist"):
        torch.empty(1, device=f"relay:{relay.device_count()}")


def test_device_context_manager_restores_the_current_device(placement):
    with relay.device(0):
        assert relay.current_device() == 0
        assert torch.empty(1, device="relay").device == torch.device("relay", 0)
    with relay.device("relay:0"), relay.device(None):
        assert relay.current_device() == 0
    relay.synchronize()
    relay.synchronize(0)


def test_memory_figures_follow_allocations(placement):
    relay.empty_cache()
    relay.reset_peak_memory_stats()
    before = relay.memory_allocated()
    x = torch.empty(1024, 1024, device="relay")  # 4 MiB
    assert relay.memory_allocated() - before == x.nbytes
    y = x + 1  # a result of the fallback, adopted by relay
    assert relay.memory_allocated() - before == 2 * x.nbytes
    peak = relay.max_memory_allocated()
    del x, y
    assert relay.memory_allocated() == before
    assert relay.max_memory_allocated() == peak >= before + 2 * 4 * 1024 * 1024
    relay.reset_peak_memory_stats()
    assert relay.max_memory_allocated() == before


def test_memory_summary_and_the_older_reset_read_the_same_figures(placement):
    relay.reset_max_memory_allocated()  # torch.cuda's older spelling
    before = relay.memory_allocated()
    assert relay.max_memory_allocated() == before
    x = torch.empty(3 * 1024 * 1024, dtype=torch.uint8, device="relay")
    summary = relay.memory_summary()
    assert summary.startswith(f"relay:0 memory, {relay.get_home()} home")
    allocated = next(line for line in summary.splitlines() if line.startswith("allocated"))
    assert f"{(before + x.nbytes) / 2**20:.2f} MiB" in allocated, summary
    del x
    relay.reset_max_memory_cached()
    assert relay.max_memory_allocated() == before


def test_generic_memory_calls_of_the_device_module(placement):
    # What code written against torch.cuda asks of torch.get_device_module(device).
    module = torch.get_device_module("relay")
    x = torch.empty(1024, 1024, device="relay")
    assert module.memory_reserved() == module.memory_allocated() >= x.nbytes
    assert module.max_memory_reserved() == module.max_memory_allocated()
    stats = module.memory_stats()
    assert stats["allocated_bytes.all.current"] == module.memory_allocated()
    assert stats["reserved_bytes.all.peak"] == module.max_memory_allocated()
    free, total = module.mem_get_info()
    assert 0 < free <= total
    assert module.get_device_name().startswith("relay")
    properties = module.get_device_properties(0)
    assert properties.name == module.get_device_name() and properties.total_memory == total


@pytest.mark.skipif(
    not hasattr(torch.accelerator, "get_device_capability"),
    reason="torch.accelerator.get_device_capability is there from PyTorch 2.10",
)
def test_torch_accelerator_tells_the_dtypes_relay_holds(placement):
    for device in (None, "relay", "relay:0", 0):
        dtypes = torch.accelerator.get_device_capability(device)["supported_dtypes"]
        assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool} <= dtypes


@pytest.mark.skipif(
    not hasattr(torch.accelerator, "memory_allocated"),
    reason="torch.accelerator has memory calls from PyTorch 2.9",
)
def test_torch_accelerator_memory_calls_read_relays_figures(placement):
    # Libraries call these for whichever accelerator torch has (accelerate's
    # clear_device_cache: torch.accelerator.empty_cache(), in every Trainer).
    accelerator = torch.accelerator
    assert accelerator.current_accelerator() == torch.device("relay")
    accelerator.empty_cache()
    accelerator.reset_peak_memory_stats()
    before = accelerator.memory_allocated()
    assert before == relay.memory_allocated()
    x = torch.empty(1024, 1024, device="relay")
    assert accelerator.memory_allocated() - before == x.nbytes
    assert accelerator.memory_reserved() == accelerator.memory_allocated()
    assert accelerator.memory_stats()["allocated_bytes.all.current"] == before + x.nbytes
    del x
    assert accelerator.max_memory_allocated() == before + 4 * 1024 * 1024
    accelerator.reset_peak_memory_stats()
    assert accelerator.max_memory_allocated() == before
    if hasattr(accelerator, "get_memory_info"):  # PyTorch 2.10 on; accelerate's device_map
        free, total = accelerator.get_memory_info()
        assert (free, total) == pytest.approx(relay.mem_get_info(), rel=0.05)
        assert 0 < free <= total


def test_timing_events_measure_the_work_between_them(placement):
    start, end = relay.Event(enable_timing=True), relay.Event(enable_timing=True)
    start.record()
    x = torch.randn(256, 256, device="relay")
    for _ in range(20):
        x = torch.tanh(x @ x)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0.0
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        relay.Event().elapsed_time(end)
    with pytest.raises(RuntimeError, match="must be recorded"):
        relay.Event(enable_timing=True).elapsed_time(end)


def test_relay_streams_name_devices_that_exist(placement):
    assert relay.Stream() == relay.Stream("relay") == relay.Stream(relay.current_device())
    with pytest.raises(IndexError, match="does not exist"):
        relay.Stream(relay.device_count())


def test_the_autograd_profiler_times_relay_work(placement):
    # use_device="relay" times the device's work as use_device="cuda" times CUDA's.
    x = torch.randn(128, 128, device="relay")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PyTorch warns per event without relay's timers
        with torch.autograd.profiler.profile(use_device="relay") as profile:
            (x @ x).sum().item()
    [mm] = [event for event in profile.key_averages() if event.key == "aten::mm"]
    assert mm.device_time_total > 0
    assert mm.device_time_total <= profile.key_averages().total_average().cpu_time_total * 2
    assert "Self RELAY" in profile.key_averages().table()


def test_a_negative_device_index_changes_nothing(placement):
    # As torch.cuda's: `with device_module.device(t.get_device())` for a CPU tensor t.
    for negative in (torch.ones(1).get_device(), -2):
        relay.set_device(negative)
        with relay.device(negative):
            assert relay.current_device() == 0
        assert relay.current_device() == 0


def test_relay_streams_are_torch_streams(placement):
    # As torch.cuda.Stream is: FSDP records tensors on the device's current stream.
    stream = relay.current_stream()
    assert isinstance(stream, torch.Stream) and stream.device == torch.device("relay", 0)
    x = torch.ones(3, device="relay")
    x.record_stream(stream)
    x.record_stream(relay.Stream())
    with relay.stream(stream):
        assert (x + 1).device.type == "relay"
    assert stream.query()


def test_generic_streams_and_events_of_relay(placement):
    # torch.Stream and torch.Event, as device-generic code makes them.
    stream = torch.Stream("relay")
    assert stream.device == torch.device("relay", relay.current_device())
    x = torch.ones(4, device="relay") * 3
    stream.synchronize()
    assert stream.query()
    start, end = torch.Event("relay", enable_timing=True), torch.Event("relay", enable_timing=True)
    start.record()
    y = x @ x
    end.record()
    end.synchronize()
    if torch.cuda.is_available():  # relay's events are the GPU's CUDA events
        assert start.elapsed_time(end) >= 0.0
    else:
        with pytest.raises(RuntimeError, match=r"use torch.relay.Event\(enable_timing=True\)"):
            start.elapsed_time(end)
    assert y.item() == 36.0


def test_record_stream_on_relay_tensors_is_accepted(placement):
    # One ordered stream per device: nothing to record, as nothing is reused early.
    x = torch.ones(4, device="relay")
    x.record_stream(torch.accelerator.current_stream())
    torch.testing.assert_close((x + 1).cpu(), torch.full((4,), 2.0))


# Serialization.


def roundtrip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


@pytest.mark.parametrize(
    "map_location",
    [None, "relay", "relay:0", torch.device("relay", 0), {"relay:0": "relay:0"}, "cpu"],
    ids=["none", "relay", "relay:0", "device", "dict", "cpu"],
)
def test_checkpoint_of_relay_tensors_loads_with_every_map_location(placement, map_location):
    model = torch.nn.Linear(3, 2).to("relay")
    state = {"model": model.state_dict(), "step": torch.tensor(7, device="relay")}
    loaded = roundtrip(state, map_location=map_location)
    expected = "cpu" if map_location == "cpu" else "relay"
    for name, tensor in model.state_dict().items():
        assert loaded["model"][name].device.type == expected
        torch.testing.assert_close(loaded["model"][name].cpu(), tensor.cpu())
    assert loaded["step"].item() == 7


def test_checkpoint_of_cpu_tensors_maps_onto_relay(placement):
    weights = {"w": torch.randn(4, 4)}
    loaded = roundtrip(weights, map_location=lambda storage, location: storage.relay())
    assert loaded["w"].device.type == "relay"
    torch.testing.assert_close(loaded["w"].cpu(), weights["w"])


def test_loaded_relay_tensors_keep_the_current_home(placement):
    loaded = roundtrip(torch.arange(6.0, device="relay"))
    assert relay.get_home() == placement.home
    torch.testing.assert_close((loaded * 2).cpu(), torch.arange(6.0) * 2)


def test_pickle_and_deepcopy(placement):
    x = torch.randn(3, 4, device="relay")
    for copied in (pickle.loads(pickle.dumps(x)), copy.deepcopy(x)):
        assert copied.device.type == "relay"
        assert copied.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
        torch.testing.assert_close(copied.cpu(), x.cpu())
    model = copy.deepcopy(torch.nn.Linear(2, 2).to("relay"))
    assert model.weight.device.type == "relay"


# Random numbers.


def test_seeded_relay_draws_are_reproducible_and_match_the_target(placement):
    relay.manual_seed(1234)
    a = torch.randn(6, device="relay")
    relay.manual_seed(1234)
    b = torch.randn(6, device="relay")
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    torch.manual_seed(1234)
    expected = torch.randn(6, device=reference_device(placement))
    torch.manual_seed(1234)
    torch.testing.assert_close(torch.randn(6, device="relay").cpu(), expected.cpu())
    assert relay.initial_seed() == 1234


def test_rng_state_round_trips_and_fork_rng(placement):
    state = relay.get_rng_state()
    first = torch.rand(5, device="relay")
    relay.set_rng_state(state)
    torch.testing.assert_close(torch.rand(5, device="relay").cpu(), first.cpu(), rtol=0, atol=0)
    states = relay.get_rng_state_all()
    assert len(states) == relay.device_count()
    relay.set_rng_state_all(states)
    with torch.random.fork_rng(device_type="relay"):
        inside = torch.rand(5, device="relay")
    after = torch.rand(5, device="relay")
    torch.testing.assert_close(inside.cpu(), after.cpu(), rtol=0, atol=0)
    with torch.testing._utils.freeze_rng_state():
        frozen = torch.rand(3, device="relay")
    torch.testing.assert_close(torch.rand(3, device="relay").cpu(), frozen.cpu(), rtol=0, atol=0)


def test_relay_generators(placement):
    generator = torch.Generator(device="relay")
    assert generator.device.type == "relay"
    generator.manual_seed(7)
    a = torch.randn(4, device="relay", generator=generator)
    generator.manual_seed(7)
    b = torch.randn(4, device="relay", generator=generator)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)
    state = generator.get_state()
    c = torch.rand(4, device="relay", generator=generator)
    generator.set_state(state)
    torch.testing.assert_close(
        torch.rand(4, device="relay", generator=generator).cpu(), c.cpu(), rtol=0, atol=0
    )
    generator.seed()
    with pytest.raises(ValueError, match="relay RNG state"):
        relay.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_dropout_draws_are_reproducible(placement):
    x = torch.ones(64, device="relay")
    torch.manual_seed(5)
    a = torch.nn.functional.dropout(x, 0.5)
    torch.manual_seed(5)
    b = torch.nn.functional.dropout(x, 0.5)
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0)


# Autocast and activation checkpointing.


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_follows_cudas_policy(placement, dtype):
    assert dtype in relay.get_amp_supported_dtype()
    a, b = torch.randn(4, 8, device="relay"), torch.randn(8, 3, device="relay")
    with torch.autocast("relay", dtype=dtype):
        product = a @ b
        linear = torch.nn.functional.linear(a, b.t())
        softmax = torch.softmax(product, dim=1)  # float32 policy
        summed = product.sum()
    assert product.dtype == dtype and linear.dtype == dtype
    assert softmax.dtype == torch.float32 and summed.dtype == torch.float32
    torch.testing.assert_close(product.float().cpu(), (a @ b).cpu(), rtol=2e-2, atol=5e-2)
    assert (a @ b).dtype == torch.float32  # outside the block
    assert relay.is_bf16_supported()


def test_autocast_to_float32_casts_half_inputs_up(placement):
    # As CUDA's autocast takes it: enabled, and a float16 matmul runs in float32.
    half = torch.randn(4, 4, device="relay", dtype=torch.float16)
    with torch.autocast("relay", dtype=torch.float32):
        assert torch.is_autocast_enabled("relay")
        product = half @ half
    assert product.dtype == torch.float32
    torch.testing.assert_close(product.cpu(), half.cpu().float() @ half.cpu().float())


def test_activation_checkpointing_gives_the_same_gradients(placement):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    block = block.to("relay")
    x = torch.randn(5, 6, device="relay")
    plain = torch.autograd.grad(block(x).sum(), list(block.parameters()))
    checkpointed = torch.autograd.grad(
        torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).sum(),
        list(block.parameters()),
    )
    for a, b in zip(checkpointed, plain, strict=True):
        torch.testing.assert_close(a.cpu(), b.cpu())


# Indexing with CPU indices, as CUDA allows.


def test_cpu_index_tensors_and_masks_index_relay_tensors(placement):
    x = torch.arange(12.0).reshape(3, 4)
    rx = x.to("relay")
    index = torch.tensor([2, 0])
    mask = torch.tensor([True, False, True])
    torch.testing.assert_close(rx[index].cpu(), x[index])
    torch.testing.assert_close(rx[mask].cpu(), x[mask])
    torch.testing.assert_close(rx[:, torch.tensor([1, 3])].cpu(), x[:, torch.tensor([1, 3])])
    rx[index] = 0.0
    x[index] = 0.0
    torch.testing.assert_close(rx.cpu(), x)


# Pinned memory.


def test_pinned_memory_is_pinned(placement):
    pinned = torch.randn(8).pin_memory()
    assert pinned.is_pinned()
    assert not torch.randn(8).is_pinned()
    on_relay = pinned.to("relay", non_blocking=True)
    relay.synchronize()
    torch.testing.assert_close(on_relay.cpu(), pinned)
    back = on_relay.to("cpu", non_blocking=True)
    relay.synchronize()
    torch.testing.assert_close(back, pinned)


def test_relay_factories_refuse_pinned_memory(placement):
    # As CUDA's: only dense CPU tensors can be pinned.
    def strided(size, **options):
        return torch.empty_strided((size,), (1,), **options)

    for make in (torch.empty, torch.zeros, torch.ones, strided):
        with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
            make(3, device="relay", pin_memory=True)


# Deterministic mode.


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_new_memory_is_filled_in_deterministic_mode(placement, deterministic, dtype):
    # As CPU and CUDA fill it: NaN, or the largest value of an integer type.
    made = [
        torch.empty(4, dtype=dtype, device="relay"),
        torch.empty_strided((2, 2), (1, 2), dtype=dtype, device="relay"),
        torch.ones(2, dtype=dtype, device="relay").new_empty(3),
    ]
    grown = torch.ones(2, dtype=dtype, device="relay")
    grown.resize_(5)
    made.append(grown[2:])
    expected = torch.empty(4, dtype=dtype)  # CPU's fill
    for tensor in made:
        on_cpu = tensor.cpu().flatten()
        torch.testing.assert_close(on_cpu, expected[: on_cpu.numel()], equal_nan=True)
    torch.testing.assert_close(grown[:2].cpu(), torch.ones(2, dtype=dtype))


# torch.compile.


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_with_eager_backends(placement, backend):
    torch._dynamo.reset()

    def fn(x, y):
        return torch.nn.functional.gelu(x @ y).sum(dim=1)

    x, y = torch.randn(4, 5, device="relay"), torch.randn(5, 3, device="relay")
    compiled = torch.compile(fn, backend=backend)
    torch.testing.assert_close(compiled(x, y).cpu(), fn(x, y).cpu())


def test_compiled_code_calls_relays_device_module(placement):
    torch._dynamo.reset()
    assert compile_cases.run() == compile_cases.expected()


def test_compile_with_inductor_is_refused_naming_relay(placement):
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.sin() + 1, backend="inductor")
    with pytest.raises(Exception, match="relay") as error:
        compiled(torch.randn(4, device="relay"))
    assert "aot_eager" in str(error.value)


COMPILED_HOST_CALLS = """
import sys, torch
{first}
import torch_fallback.relay
print("dynamo imported with relay:", "torch._dynamo" in sys.modules)
sys.path.insert(0, {tests!r})
import compile_cases
print(compile_cases.run())
"""


@pytest.mark.parametrize("dynamo_first", [False, True], ids=["dynamo-later", "dynamo-first"])
def test_relay_imports_no_compiler_and_compiled_code_still_calls_it_eagerly(dynamo_first):
    """Dynamo's import takes most of a second: relay's import leaves it out, and the
    device module's host calls are disabled for it when it comes (or at once, where
    it came first)."""
    script = COMPILED_HOST_CALLS.format(
        first="import torch._dynamo" if dynamo_first else "", tests=str(Path(__file__).parent)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    expected = compile_cases.expected()
    assert lines == [f"dynamo imported with relay: {dynamo_first}", str(expected)], (
        done.stdout + done.stderr[-3000:]
    )


# Sparse layouts.


@pytest.mark.parametrize(
    "make", [torch.Tensor.to_sparse, torch.Tensor.to_sparse_csr], ids=["coo", "csr"]
)
def test_sparse_tensors_are_refused_at_to_relay(placement, make):
    sparse = make(torch.eye(3))
    with pytest.raises((NotImplementedError, RuntimeError), match="relay"):
        sparse.to("relay")


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8).to("relay"),
        lambda: torch.empty(3, dtype=torch.quint8, device="relay"),
        lambda: torch.quantize_per_tensor(torch.randn(4, device="relay"), 0.1, 0, torch.qint8),
    ],
    ids=["moved", "made", "quantized-there"],
)
def test_quantized_tensors_are_refused_with_what_to_do(placement, make):
    with pytest.raises(NotImplementedError, match=r"quantized .* which relay tensors cannot be"):
        make()


BACKWARD_BEFORE_IMPORT = """
import os, torch
x = torch.ones(3, requires_grad=True)
(x * 2).sum().backward()  # autograd's engine starts its device threads here
import torch_fallback.relay
for index in range(torch.relay.device_count()):
    y = torch.ones(3, device=f"relay:{index}", requires_grad=True)
    (y * y).sum().backward()
    print(index, y.grad.cpu().tolist())
if os.fork() == 0:  # a fork child has no engine threads: a clear error, not a hang
    try:
        z = torch.ones(3, device="relay", requires_grad=True)
        z.sum().backward()
        os._exit(3)
    except RuntimeError:
        os._exit(0)
_, status = os.wait()
print("child", os.waitstatus_to_exitcode(status))
"""


def test_relay_imported_after_a_backward_still_differentiates():
    """Autograd's engine counts devices at its first backward; relay imported later
    gets device threads of its own."""
    done = subprocess.run(
        [sys.executable, "-c", BACKWARD_BEFORE_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[:-1] == [f"{i} [2.0, 2.0, 2.0]" for i in range(len(lines) - 1)]
    assert len(lines) >= 2 and lines[-1] == "child 0", done.stdout
