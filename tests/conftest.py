"""Fixtures and markers of this project's tests.

The markers requires_cuda, requires_two_gpus, cpu_wheel and cuda_wheel, and the rules
that skip them (TORCH_FALLBACK_REQUIRE_GPU=1 turns a missing GPU into a failure), come
from the pytest plugin torch_fallback.testing.plugin, which backends use too. It imports
torch_fallback, so it is loaded only where torch is installed; the tooling's tests
(tests/matrix) run without torch, and there the markers are only registered.

The fixtures `fallback_settings` and `placement` (target x home) serve the tests of
the built extension (tests/library, tests/relay, tests/packaging, tests/models); they
import torch_fallback only when a test asks for them.

Under pytest-xdist (``pytest -n N``; the cells run their tests so) each worker gets its
share of the cores for torch's intra-op threads, and so do the processes it starts
(OMP_NUM_THREADS), so that N workers do not each start a thread per core.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass

import pytest

XDIST_WORKERS_ENV = "PYTEST_XDIST_WORKER_COUNT"  # set by pytest-xdist in each worker
THREADS_ENV = "OMP_NUM_THREADS"


def worker_threads(environ: Mapping[str, str], cpus: int) -> int | None:
    """The intra-op threads of one xdist worker: its share of ``cpus`` (at least 1); None
    outside xdist, or where OMP_NUM_THREADS already says."""
    workers = environ.get(XDIST_WORKERS_ENV, "")
    if not workers.isdigit() or int(workers) < 1 or environ.get(THREADS_ENV):
        return None
    return max(1, cpus // int(workers))


def share_the_cores(environ: MutableMapping[str, str] = os.environ) -> int | None:
    """Set OMP_NUM_THREADS to this worker's share before torch loads (its OpenMP runtime
    reads it then; the ranks and subprocesses a test starts inherit it); torch's own
    setting too, should torch be loaded already."""
    threads = worker_threads(environ, len(os.sched_getaffinity(0)))
    if threads is not None:
        environ[THREADS_ENV] = str(threads)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
    return threads


share_the_cores()

if importlib.util.find_spec("torch") is not None:
    pytest_plugins = ["torch_fallback.testing.plugin"]
else:
    PLUGIN_MARKERS = ("requires_cuda", "requires_two_gpus", "cpu_wheel", "cuda_wheel")

    def pytest_configure(config: pytest.Config) -> None:
        """Without torch, so that --strict-markers accepts the plugin's markers."""
        for name in PLUGIN_MARKERS:
            config.addinivalue_line(
                "markers", f"{name}: see torch_fallback.testing.plugin (needs torch)"
            )


@dataclass(frozen=True)
class Placement:
    target: str  # where the fallback runs ops: "cpu" or "cuda"
    home: str  # where relay tensors keep their memory: "cpu" or "cuda"

    def __str__(self) -> str:
        return f"target={self.target}-home={self.home}"


PLACEMENTS = [
    pytest.param(Placement("cpu", "cpu"), id="target-cpu-home-cpu"),
    pytest.param(
        Placement("cpu", "cuda"), id="target-cpu-home-cuda", marks=pytest.mark.requires_cuda
    ),
    pytest.param(
        Placement("cuda", "cpu"), id="target-cuda-home-cpu", marks=pytest.mark.requires_cuda
    ),
    pytest.param(
        Placement("cuda", "cuda"), id="target-cuda-home-cuda", marks=pytest.mark.requires_cuda
    ),
]


@pytest.fixture
def fallback_settings() -> Iterator[None]:
    """The test starts from the defaults and leaves torch_fallback's settings as it found them."""
    import torch_fallback
    import torch_fallback.relay

    saved = (
        torch_fallback.get_target(),
        torch_fallback.relay.get_home(),
        torch_fallback.get_cpu_ops(),
        torch_fallback.get_cuda_sync(),
    )
    torch_fallback.reset_metrics()
    yield
    torch_fallback.set_target(saved[0])
    torch_fallback.relay.set_home(saved[1])
    torch_fallback.set_cpu_ops(saved[2])
    torch_fallback.set_cuda_sync(saved[3])


@pytest.fixture(params=PLACEMENTS)
def placement(request: pytest.FixtureRequest, fallback_settings: None) -> Placement:
    """Each placement in turn: the fallback's target and relay's home set for the test."""
    import torch_fallback
    import torch_fallback.relay

    chosen: Placement = request.param
    torch_fallback.set_target(chosen.target)
    torch_fallback.relay.set_home(chosen.home)
    return chosen
