"""DTensor's random ops on relay device meshes.

DTensor keeps the ranks' random numbers in step with an offset-based tracker,
which reads and writes a device's RNG state as CUDA's Philox pair: 16 bytes,
a seed then an offset. relay's state holds the CPU generator's state, then the
CUDA generator's, so the tracker failed on every random op of a relay DTensor
(`nn.init` of sharded parameters, dropout, `reset_parameters()` after
`fully_shard` of a model made on the meta device).

For relay meshes, the tracker sees relay's generators in that form (PhiloxForm):

- CUDA target: the CUDA generator's own (seed, offset), where random ops run;
  the tracker offsets it as it offsets CUDA's.
- CPU target: the CPU generator (a Mersenne Twister) has no offset. Its form is
  a seed drawn from a copy of it, at offset 0; a form written back reseeds it
  from the pair. Every shard then draws its own numbers, every replica the same ones,
  and the ranks' generators stay in step, as on CUDA; the numbers are not those
  of one whole-tensor draw, which a CPU generator cannot split.

PyTorch names its tracker class in one place, which install() extends for
relay meshes; trackers of other devices are PyTorch's own.
"""

from __future__ import annotations

import contextlib
import struct
import types
from typing import Any

import torch

import torch_fallback

from ._imports import when_imported

_MASK = (1 << 64) - 1
_PHILOX_BYTES = 16  # CUDA's generator state: the seed, then the offset (two 64-bit words)


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def _random_ops_run_on_cuda() -> bool:
    target = torch_fallback.get_target()
    return target == "cuda" or (target == "auto" and torch.cuda.device_count() > 0)


def philox_pair(whole: torch.Tensor) -> torch.Tensor:
    """The (seed, offset) pair, 16 bytes, of a whole relay RNG state."""
    if _random_ops_run_on_cuda():
        return whole[-_PHILOX_BYTES:].clone()
    cpu = torch.Generator()
    cpu.set_state(whole[: cpu.get_state().numel()])
    seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64, generator=cpu))
    return torch.frombuffer(bytearray(struct.pack("<QQ", seed & _MASK, 0)), dtype=torch.uint8)


class PhiloxForm:
    """A relay generator as the (seed, offset) pair DTensor's tracker reads and writes."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def get_state(self) -> torch.Tensor:
        return philox_pair(self.generator.get_state())

    def set_state(self, state: torch.Tensor) -> None:
        state = state.detach().to("cpu", torch.uint8).contiguous()
        if state.numel() != _PHILOX_BYTES:
            # Not DTensor's pair: a whole relay state (torch.random.fork_rng's).
            self.generator.set_state(state)
            return
        whole = self.generator.get_state()
        if _random_ops_run_on_cuda():
            whole[-_PHILOX_BYTES:] = state
        else:
            seed, offset = struct.unpack("<QQ", bytes(state.tolist()))
            cpu = torch.Generator().manual_seed(_splitmix64(seed ^ _splitmix64(offset)))
            cpu_state = cpu.get_state()
            whole[: cpu_state.numel()] = cpu_state
        self.generator.set_state(whole)


class _DeviceHandle:
    """torch.relay as the tracker uses it: RNG states in Philox form, all else as is."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def get_rng_state(self, device: Any = "relay") -> torch.Tensor:
        return PhiloxForm(self._module.default_generator(device)).get_state()

    def set_rng_state(self, new_state: torch.Tensor, device: Any = "relay") -> None:
        PhiloxForm(self._module.default_generator(device)).set_state(new_state)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


def _is_relay(generator: torch.Generator | None) -> bool:
    return generator is not None and generator.device.type == "relay"


TRACKER_MODULE = "torch.distributed.tensor._random"


def install() -> None:
    """Extend DTensor's offset-based RNG tracker to relay meshes, now or when DTensor
    is imported (once a process)."""
    if not torch.distributed.is_available():
        return
    # Importing DTensor costs a few tenths of a second, which a process without it
    # does not pay.
    when_imported(TRACKER_MODULE, extend_tracker)


def extend_tracker(_random: types.ModuleType) -> None:
    """Make DTensor's OffsetBasedRNGTracker one that serves relay meshes too."""
    base = getattr(_random, "OffsetBasedRNGTracker", None)
    if base is None or getattr(base, "_relay_aware", False):
        return

    class OffsetBasedRNGTracker(base):  # type: ignore[misc, valid-type]
        _relay_aware = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # its state sync broadcasts whole relay states
            device = getattr(self, "_device", None)
            if getattr(device, "type", None) != "relay":
                return
            self._device_handle = _DeviceHandle(self._device_handle)
            # Older trackers keep the synchronized state themselves, read once here.
            states = getattr(self, "rng_states", None)
            if isinstance(states, dict) and "parallel-rng" in states:
                states["parallel-rng"] = philox_pair(states["parallel-rng"])

        @contextlib.contextmanager
        def _distribute_region(self, spec: Any, generator: torch.Generator | None = None):
            # A generator passed to the op (nn.init's generator=): its Philox form too.
            if generator is None:
                region = super()._distribute_region(spec)
            else:
                form = PhiloxForm(generator) if _is_relay(generator) else generator
                region = super()._distribute_region(spec, form)  # type: ignore[arg-type]
            with region:
                yield

    OffsetBasedRNGTracker.__doc__ = base.__doc__
    OffsetBasedRNGTracker.__qualname__ = base.__qualname__
    OffsetBasedRNGTracker.__module__ = base.__module__
    _random.OffsetBasedRNGTracker = OffsetBasedRNGTracker
