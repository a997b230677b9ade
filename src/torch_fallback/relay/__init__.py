"""relay: a PrivateUse1 device served by torch-fallback, also reachable as ``torch.relay``.

``import torch_fallback.relay`` registers it (as ``import torch_openreg`` does
for PyTorch's reference backend): PrivateUse1 is renamed ``relay`` and this
module becomes its device module. relay tensors own memory on a *home*, host
memory ("cpu", the default) or a CUDA GPU's memory ("cuda"). relay implements
natively only what a backend must (allocation, resize, set_; views and copies
from torch-fallback's C++ API); every other op runs through the boxed fallback.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

import torch_fallback  # the library relay's extension resolves its fallback from
from torch_fallback import distributed as _distributed

from .._scoped import scoped
from . import _C, _cuda_autograd, _dtensor_random, _imports, _inductor, _sharing, _streams  # noqa: F401  (_C: torch.ops.relay)

NAME = "relay"
_ops = torch.ops.relay
HOMES = ("cpu", "cuda")

# The stream API of a device module, for code that drives copies through it (FSDP2).
Event, Stream, stream = _streams.Event, _streams.Stream, _streams.stream
current_stream, default_stream = _streams.current_stream, _streams.default_stream


DeviceLike = int | str | torch.device


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to initialise: relay is ready once imported."""


def _is_in_bad_fork() -> bool:
    return False


# torch.compile traces this module's code. The current index reads through
# torch.accelerator (relay is its accelerator once imported), which Dynamo
# folds into a constant with a guard, as it folds torch.cuda's; the calls that
# change host state (generators, the current device) run eagerly, a graph
# break, where tracing their ops would fail. Dynamo's import takes most of a
# second: they are disabled for it (torch.compiler.disable) when it is first
# imported, before it can trace anything (_disable_host_calls).
_HOST_CALLS: list[str] = []  # qualified names in this module


def _host_call(fn: Callable[..., Any]) -> Callable[..., Any]:
    _HOST_CALLS.append(fn.__qualname__)
    return fn


def _disable_host_calls(dynamo: types.ModuleType) -> None:
    for qualname in _HOST_CALLS:
        *path, name = qualname.split(".")
        owner: Any = sys.modules[__name__]
        for part in path:
            owner = getattr(owner, part)
        setattr(owner, name, dynamo.disable(getattr(owner, name)))


# Older torch.accelerator lacks it: then the index comes from relay's op (a graph break).
_current_index = getattr(getattr(torch, "accelerator", None), "current_device_index", None)


def device_count() -> int:
    """relay:i keeps its GPU memory on cuda:i: one device per visible GPU, at least one."""
    return _ops.device_count()  # what torch.accelerator.device_count() asks


def current_device() -> int:
    return _current_index() if _current_index is not None else _ops.current_device()


@_host_call
def set_device(device: DeviceLike) -> None:
    """Make `device` current, and with a GPU visible the GPU of the same index (relay:N
    keeps its GPU memory on cuda:N); an index that does not exist is an IndexError, a
    negative one does nothing (as for torch.cuda.set_device)."""
    index = _index(device)
    if index >= 0:
        _ops.set_device(index)


class device:
    """``with torch.relay.device(1):`` makes relay:1 current inside the block."""

    def __init__(self, device: DeviceLike | None) -> None:
        self.index = -1 if device is None else _index(device)
        self.previous = -1

    @_host_call
    def __enter__(self) -> None:
        self.previous = current_device()
        if self.index >= 0:
            set_device(self.index)

    @_host_call
    def __exit__(self, *exc_info: object) -> None:
        set_device(self.previous)


def synchronize(device: DeviceLike | None = None) -> None:
    """Wait for relay work on the device's GPU; host-homed work is already done."""
    _ops.synchronize(_index(device))


# Memory: bytes held by relay tensors, whichever their home.


def memory_allocated(device: DeviceLike | None = None) -> int:
    return _ops.memory_allocated(_index(device))


def max_memory_allocated(device: DeviceLike | None = None) -> int:
    return _ops.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device: DeviceLike | None = None) -> None:
    _ops.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device: DeviceLike | None = None) -> None:
    """As torch.cuda's, which deprecates it: reset_peak_memory_stats."""
    reset_peak_memory_stats(device)


reset_max_memory_cached = reset_max_memory_allocated


def memory_summary(device: DeviceLike | None = None, abbreviated: bool = False) -> str:
    """memory_stats() as a table, for code that prints torch.cuda.memory_summary();
    `abbreviated` is taken and changes nothing (relay has one pool)."""
    stats = memory_stats(device)
    index = _utils._get_device_index(device)

    def size(value: int) -> str:
        if value < 1024:
            return f"{value} B"
        scaled = value / 1024
        for unit in ("KiB", "MiB"):
            if scaled < 1024:
                return f"{scaled:.2f} {unit}"
            scaled /= 1024
        return f"{scaled:.2f} GiB"

    lines = [
        f"relay:{index} memory, {get_home()} home (relay keeps no cache: reserved is allocated)",
        f"{'':<18}{'current':>14}{'peak':>14}",
    ]
    for kind in ("allocated_bytes", "reserved_bytes"):
        current, peak = stats[f"{kind}.all.current"], stats[f"{kind}.all.peak"]
        lines.append(f"{kind.split('_')[0]:<18}{size(current):>14}{size(peak):>14}")
    return "\n".join(lines)


def memory_reserved(device: DeviceLike | None = None) -> int:
    """As memory_allocated: relay keeps no cache of its own."""
    return memory_allocated(device)


def max_memory_reserved(device: DeviceLike | None = None) -> int:
    return max_memory_allocated(device)


def memory_stats(device: DeviceLike | None = None) -> dict[str, int]:
    """The figures torch.cuda.memory_stats gives under the same keys, for all pools."""
    current, peak = memory_allocated(device), max_memory_allocated(device)
    return {
        f"{kind}.all.{figure}": value
        for kind in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes")
        for figure, value in (("current", current), ("peak", peak))
    }


def mem_get_info(device: DeviceLike | None = None) -> tuple[int, int]:
    """Free and total bytes where new relay tensors go: the GPU's with a CUDA home,
    else the host's."""
    if get_home() == "cuda":
        return torch.cuda.mem_get_info(_utils._get_device_index(device))
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What code written for torch.cuda.get_device_properties reads most."""

    name: str
    total_memory: int


def get_device_name(device: DeviceLike | None = None) -> str:
    """relay, and where new relay tensors keep their memory."""
    if get_home() == "cuda":
        return f"relay (memory on {torch.cuda.get_device_name(_utils._get_device_index(device))})"
    return "relay (host memory)"


def get_device_properties(device: DeviceLike | None = None) -> DeviceProperties:
    return DeviceProperties(name=get_device_name(device), total_memory=mem_get_info(device)[1])


def empty_cache() -> None:
    """Release cached GPU memory of CUDA-homed tensors (host memory is not cached)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# Homes.


def get_home() -> str:
    """Home of new relay tensors: "cpu" (host memory) or "cuda" (GPU memory)."""
    return _ops.get_home()


def set_home(home: str) -> None:
    """Set where new relay tensors keep their memory. A CUDA home without CUDA
    or without a GPU is an error at the first allocation."""
    _ops.set_home(home)


def home(home: str) -> contextlib.AbstractContextManager[None]:
    """``with relay.home("cuda"):`` allocates on the GPU inside the block."""
    return scoped(get_home, set_home, home)


def home_is_page_locked(tensor: torch.Tensor) -> bool:
    """Whether a relay tensor's memory is page-locked host memory: host memory
    allocated while the fallback sends ops to a GPU is, so that the copies to
    and from the GPU run asynchronously and at full speed."""
    if tensor.device.type != NAME:
        raise ValueError(f"home_is_page_locked takes a relay tensor, got one on {tensor.device}")
    return _ops.is_page_locked(tensor.untyped_storage().data_ptr())


# Random numbers. Random ops run on the fallback target; relay's default
# generator of a device pairs the CPU's default generator with the CUDA one of
# its GPU, so seeded relay draws equal seeded eager draws on the target.


@_host_call
def default_generator(device: DeviceLike | None = None) -> torch.Generator:
    return _ops.default_generator(_index(device))


@_host_call
def get_rng_state(device: DeviceLike = NAME) -> torch.Tensor:
    return default_generator(device).get_state()


@_host_call
def set_rng_state(new_state: torch.Tensor, device: DeviceLike = NAME) -> None:
    default_generator(device).set_state(new_state.cpu())


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(index) for index in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)


@_host_call
def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed))


@_host_call
def manual_seed_all(seed: int) -> None:
    # torch.manual_seed calls this for custom devices.
    for index in range(device_count()):
        default_generator(index).manual_seed(int(seed))


@_host_call
def seed() -> int:
    return default_generator().seed()


@_host_call
def seed_all() -> None:
    seed_value = default_generator().seed()
    manual_seed_all(seed_value)


@_host_call
def initial_seed() -> int:
    return default_generator().initial_seed()


# Autocast: relay follows CUDA's policy (low precision matmuls and
# convolutions, float32 reductions), in the dtypes CUDA's autocast takes.


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16, torch.float32]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


def _index(device: DeviceLike | None) -> int:
    """The relay device index named by `device`; -1 (the current one) for None or a
    negative index (a CPU tensor's get_device()), as torch.cuda takes them."""
    if device is None or (isinstance(device, int) and device < 0):
        return -1
    if isinstance(device, int):
        _ops.check_device_index(device)
        return device
    device = torch.device(device)
    if device.type != NAME:
        raise ValueError(f"expected a relay device, got {device}")
    if device.index is None:
        return -1
    _ops.check_device_index(device.index)
    return device.index


def __getattr__(name: str) -> object:
    # Inductor's code generators for relay, looked up by torch.compile.
    if name in _inductor.CODEGEN_NAMES:
        return _inductor.codegen_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Utils:
    """What torch.serialization asks of a device module."""

    @staticmethod
    def _get_device_index(device: DeviceLike | None, optional: bool = False) -> int:
        index = _index(device)
        return current_device() if index < 0 else index


_utils = _Utils()


def _register() -> None:
    """Make relay a torch device; idempotent within a process."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    if not hasattr(torch, NAME):
        torch._register_device_module(NAME, sys.modules[__name__])
    if not hasattr(torch.Tensor, NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )


_register()
_ops.add_autograd_device_threads()  # for an engine started before this import
_distributed.register(NAME)  # "relaycc": collectives on gloo (host home) or NCCL (CUDA home)
_cuda_autograd.install()
# Fixed for the process, as torch.cuda's (what torch.compiler.assume_constant_result marks).
device_count._dynamo_marked_constant = True  # type: ignore[attr-defined]
_imports.when_imported("torch._dynamo", _disable_host_calls)
_dtensor_random.install()  # DTensor's random ops on relay meshes
_sharing.install()  # relay tensors sent to other processes share their memory
if "TORCH_FALLBACK_RELAY_HOME" in os.environ:
    set_home(os.environ["TORCH_FALLBACK_RELAY_HOME"].strip())
# Let autograd's relay threads drop every graph before the interpreter shuts
# down: a graph released there later would abort the process.
atexit.register(_ops.finish_autograd_work)

del torch_fallback
