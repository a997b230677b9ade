"""torch.distributed on relay: each collective on the engine of the tensors' home.

Host-homed relay runs on gloo with two processes in every cell; CUDA-homed relay
runs on NCCL, with world size 1 on one GPU and the same tests marked
``requires_two_gpus`` for two. Each rank is a process of its own
(torch.multiprocessing.spawn); distributed_cases.py holds what the ranks run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from distributed_cases import (
    DDP_VARIANTS,
    TIMEOUT_S,
    norm_reference,
    reference_training,
    run_rank,
)

import torch_fallback.distributed

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not built in this torch"
)

# (home, target, world size) of each engine's runs
GLOO = pytest.param(("cpu", "cpu", 2), id="gloo-2-ranks")
NCCL = [
    pytest.param(
        ("cuda", target, 1), id=f"nccl-1-rank-target-{target}", marks=pytest.mark.requires_cuda
    )
    for target in ("cuda", "cpu")
] + [
    pytest.param(
        ("cuda", "cuda", 2),
        id="nccl-2-ranks",
        marks=[pytest.mark.requires_cuda, pytest.mark.requires_two_gpus],
    )
]
ENGINES = [GLOO, *NCCL]
DEADLINE_S = 240  # a rank running longer hangs
# DDP's register_comm_hook accepts bf16_compress_hook only from a torch built with CUDA
# and NCCL 2.10+ (or XPU and XCCL), whatever the engine; it then runs on gloo too.
BF16_HOOK_ACCEPTED = (
    torch.version.cuda is not None
    and torch.distributed.is_available()
    and torch.distributed.is_nccl_available()
    and torch.cuda.nccl.version() >= (2, 10)
)


def run_ranks(case: str, setup: tuple[str, str, int], tmp_path: Path, backend: str | None) -> None:
    """The ranks of ``case``, each a process; a rank still running after DEADLINE_S fails
    the test (and is killed) instead of hanging it."""
    home, target, world = setup
    ranks = mp.spawn(
        run_rank,
        args=(world, case, str(tmp_path), home, target, backend),
        nprocs=world,
        join=False,
    )
    deadline = time.monotonic() + DEADLINE_S
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail(f"{case}: ranks still running after {DEADLINE_S} s (killed)")


def spawn(case: str, setup: tuple[str, str, int], tmp_path: Path, backend: str | None = None):
    world = setup[2]
    run_ranks(case, setup, tmp_path, backend)
    results = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(world)]
    for rank, result in enumerate(results):
        assert "error" not in result, f"rank {rank}: {result['error']}\n{result.get('trace', '')}"
    return results


def assert_trained_as(
    got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], label: str, **tolerance
) -> None:
    """Each of a rank's trained tensors equals one process's (float64: 1e-10 by default)."""
    tolerance = tolerance or {"rtol": 1e-10, "atol": 1e-12}
    for name, reference in expected.items():
        torch.testing.assert_close(
            got[name], reference, **tolerance, msg=lambda m, n=name: f"{label}, {n}: {m}"
        )


@pytest.mark.parametrize("setup", ENGINES)
def test_every_collective_matches_its_definition(setup, tmp_path):
    for rank, result in enumerate(spawn("collectives", setup, tmp_path)):
        names = [name for name, _, _ in result["checks"]]
        assert "all_gather_into_tensor" in names and "reduce_scatter_tensor" in names
        for name, got, expected in result["checks"]:
            torch.testing.assert_close(
                got, expected.to(got.dtype), msg=lambda m, n=name, r=rank: f"rank {r}, {n}: {m}"
            )


@pytest.mark.parametrize(
    "backend", [None, "relaycc", "cpu:gloo,relay:relaycc"], ids=["no-backend", "name", "pairs"]
)
def test_init_process_group_spellings(backend, tmp_path):
    results = spawn("collectives", ("cpu", "cpu", 2), tmp_path, backend)
    assert "relay:relaycc" in results[0]["backend"]


TOLERANCE: dict[str, dict[str, float]] = {
    "fp16_compress_hook": {"rtol": 2e-3, "atol": 2e-3},
    "bf16_compress_hook": {"rtol": 2e-2, "atol": 2e-2},
}


@pytest.mark.parametrize("variant", sorted(DDP_VARIANTS))
@pytest.mark.parametrize("setup", ENGINES)
def test_ddp_trains_as_one_process_over_the_global_batch(setup, variant, tmp_path):
    if variant == "bf16_compress_hook" and not BF16_HOOK_ACCEPTED:
        # PyTorch's own check: a torch built with CUDA and NCCL 2.10+ (or XPU and XCCL)
        with pytest.raises(AssertionError, match="BF16 all reduce communication hook required"):
            spawn(f"ddp-{variant}", setup, tmp_path)
        return
    results = spawn(f"ddp-{variant}", setup, tmp_path)
    expected = reference_training(variant)
    tolerance = TOLERANCE.get(variant, {})
    for rank, result in enumerate(results):
        assert result["devices"] == ["relay"] and result["grad_devices"] == ["relay"]
        assert result["forward_time_ns"] > 0, "DDP recorded no runtime statistics"
        assert_trained_as(result["parameters"], expected, f"rank {rank}, {variant}", **tolerance)


@pytest.mark.parametrize("case", ["fsdp1", "fsdp2"])
@pytest.mark.parametrize("setup", ENGINES)
def test_fsdp_trains_as_one_process_over_the_global_batch(setup, case, tmp_path):
    expected = reference_training("default")
    for rank, result in enumerate(spawn(case, setup, tmp_path)):
        assert result["devices"] == ["relay"]
        assert_trained_as(result["parameters"], expected, f"rank {rank}, {case}")


@pytest.mark.parametrize("layout", ["contiguous", "channels-last"])
@pytest.mark.parametrize("setup", ENGINES)
def test_sync_batchnorm_trains_as_batchnorm_over_the_global_batch(setup, layout, tmp_path):
    # Across ranks SyncBatchNorm runs CUDA-only ops (batch_norm_stats, the gathered
    # statistics, the elementwise forward and backward); the CPU target decomposes them.
    channels_last = layout == "channels-last"
    case = "sync-batchnorm-channels-last" if channels_last else "sync-batchnorm"
    expected = norm_reference(channels_last)
    assert "norm.running_var" in expected and "norm.num_batches_tracked" in expected
    for rank, result in enumerate(spawn(case, setup, tmp_path)):
        assert result["devices"] == ["relay"]
        assert result["state"].keys() == expected.keys()
        assert_trained_as(result["state"], expected, f"rank {rank}, {layout}")


def test_monitored_barrier_runs_on_gloo_where_pytorch_lets_it_and_on_a_cpu_group(tmp_path):
    for rank, result in enumerate(spawn("monitored-barrier", GLOO.values[0], tmp_path)):
        outcome = result["outcome"]
        # Some torch versions refuse a group whose backend is not named gloo in Python.
        assert outcome == "passed" or "only implemented for GLOO" in outcome, f"rank {rank}"
        assert result["passed_relaycc"] and result["passed_cpu_group"]


@pytest.mark.parametrize("setup", ENGINES)
def test_dtensor_random_ops_keep_ranks_in_step(setup, tmp_path):
    """Each shard draws its own numbers and each replica the same ones, reproducibly
    from a seed, and the ranks' generators stay in step (DTensor's RNG tracker)."""
    results = spawn("dtensor-random", setup, tmp_path)
    for result in results:
        for name, first in result["first"].items():  # the same seed, the same numbers
            assert torch.equal(first, result["second"][name]), name
        first = result["first"]
        assert not torch.equal(first["sharded"], first["sharded_again"])
        kept = first["dropped"].count_nonzero().item() / first["dropped"].numel()
        assert 0.3 < kept < 0.7, kept
        assert set(first["dropped"].unique().tolist()) <= {0.0, 2.0}
        assert result["fsdp_grads_finite"]
        for name, local in result["fsdp_local"].items():
            assert local.isfinite().all() and local.ne(0).all(), name
    for name in ("replicated", "after"):  # the same on every rank
        for result in results[1:]:
            assert torch.equal(result["first"][name], results[0]["first"][name]), name
    for name in ("sharded", "dropped", "initialized"):  # each shard its own
        shards = [result["first"][name] for result in results]
        for i, shard in enumerate(shards):
            assert all(not torch.equal(shard, other) for other in shards[i + 1 :]), name
    for name in results[0]["fsdp_local"]:
        shards = [result["fsdp_local"][name] for result in results]
        for i, shard in enumerate(shards):
            assert all(not torch.equal(shard, other) for other in shards[i + 1 :]), name


@pytest.mark.parametrize("case", ["stalled-peer", "dead-peer"])
def test_a_lost_peer_gives_the_others_the_engines_error_never_a_hang(case, tmp_path):
    run_ranks(case, ("cpu", "cpu", 2), tmp_path, None)
    result: dict[str, Any] = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert "error" not in result, result.get("trace")
    assert result["raised"], "all_reduce returned although its peer never joined"
    if case == "stalled-peer":
        assert "timed out" in result["raised"].lower() or "timeout" in result["raised"].lower()
    assert result["seconds"] < TIMEOUT_S * 3, f"took {result['seconds']:.1f}s to fail"


def test_the_backend_is_registered_under_its_documented_name():
    assert torch_fallback.distributed.backend_name("relay") == "relaycc"
    assert torch.distributed.Backend.default_device_backend_map["relay"] == "relaycc"
    # CPU collectives keep gloo unless a process group names relaycc for them
    assert torch.distributed.Backend.default_device_backend_map["cpu"] == "gloo"


@pytest.mark.requires_cuda
def test_tensors_in_two_homes_are_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="different homes"):
        spawn("mixed-homes", ("cuda", "cuda", 1), tmp_path)


# init_process_group of some torch releases (2.11) takes a device_id only of the
# accelerator's type, and a registered PrivateUse1 device is the accelerator.
ACCELERATOR_ONLY = "does not match the current compilation's accelerator support"
NCCL_JOB = """
import torch, torch.distributed as dist
import torch_fallback.relay
dist.init_process_group(
    "nccl", init_method="file://{store}", rank=0, world_size=1, {device_id}
)
{barrier}
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
dist.broadcast(x, 0)
torch.cuda.synchronize()
print("sum", x.sum().item())
dist.destroy_process_group()
"""


@pytest.mark.requires_cuda
@pytest.mark.parametrize("named_device", [False, True], ids=["collectives", "device-id-barrier"])
def test_a_nccl_job_that_imports_relay_still_runs(named_device, tmp_path):
    """Importing relay makes it torch's accelerator. A plain NCCL job's collectives on
    CUDA tensors still run; its barrier, which runs on the device the job names
    (device_id=, as PyTorch asks of NCCL jobs) or else on the accelerator, runs
    wherever that torch's init_process_group accepts a device_id of another type
    than the accelerator's."""
    code = NCCL_JOB.format(
        store=tmp_path / "store",
        device_id="device_id=torch.device('cuda', 0)," if named_device else "",
        barrier="dist.barrier()" if named_device else "",
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    if named_device and done.returncode != 0 and ACCELERATOR_ONLY in done.stderr:
        pytest.xfail(f"torch {torch.__version__} takes device_id only of the accelerator's type")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sum 4.0" in done.stdout


@pytest.mark.requires_cuda
@pytest.mark.requires_two_gpus
def test_relay_set_device_makes_the_gpu_of_the_same_index_current():
    import torch_fallback.relay

    previous = torch.relay.current_device()
    try:
        torch_fallback.relay.set_device(1)
        assert torch.cuda.current_device() == 1
        torch_fallback.relay.set_device(0)
        assert torch.cuda.current_device() == 0
    finally:
        torch_fallback.relay.set_device(previous)
