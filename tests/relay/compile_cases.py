"""Code written for torch.cuda, compiled against relay's device module: the device
index and count fold into the graph; seeding and generator state run eagerly between
graphs. test_device.py runs it in its own process and in fresh ones (importable there:
the compiled functions are made only when run() is called, after relay's import)."""

from __future__ import annotations

import torch


def run() -> dict[str, list[float]]:
    relay = torch.relay

    @torch.compile(backend="eager", fullgraph=True)
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * (relay.current_device() + 1) + relay.device_count()

    def reseeded(x: torch.Tensor) -> torch.Tensor:
        relay.manual_seed(7)
        state = relay.get_rng_state()
        first = torch.rand(3, device="relay")
        relay.set_rng_state(state)
        with relay.device(0):
            again = torch.rand(3, device="relay")
        return x + first - again + relay.initial_seed()

    x = torch.zeros(3, device="relay")
    return {
        "scaled": scaled(torch.ones(2, device="relay")).cpu().tolist(),
        "reseeded compiled": torch.compile(reseeded, backend="eager")(x).cpu().tolist(),
        "reseeded eager": reseeded(x).cpu().tolist(),
    }


def expected() -> dict[str, list[float]]:
    """What run() gives: the count folded in, and the same numbers drawn again from seed 7."""
    count = torch.relay.device_count()
    return {
        "scaled": [1.0 + count] * 2,
        "reseeded compiled": [7.0] * 3,
        "reseeded eager": [7.0] * 3,
    }
