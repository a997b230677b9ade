"""What each rank of the distributed tests runs (torch.multiprocessing.spawn needs them
importable): every collective against its definition, and DDP training steps.

A rank writes its outcome to ``<out>/rank<N>.pt``; the test process compares.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

STEPS = 3
TIMEOUT_S = 3  # init_process_group's timeout in the lost-peer cases
BATCH = 8  # the global batch, split evenly over the ranks


def run_rank(
    rank: int, world: int, case: str, out: str, home: str, target: str, backend: str | None
) -> None:
    """The entry point of one rank (torch.multiprocessing.spawn passes the rank first)."""
    import torch_fallback
    import torch_fallback.relay

    torch_fallback.set_target(target)
    torch_fallback.relay.set_home(home)
    if home == "cuda":
        torch.relay.set_device(rank % torch.relay.device_count())
    result: dict[str, Any] = {}
    try:
        dist.init_process_group(
            backend,
            init_method=f"file://{out}/store",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=TIMEOUT_S if case.endswith("peer") else 60),
        )
        result = CASES[case](rank, world)
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}", "trace": traceback.format_exc()}
    finally:
        torch.save(result, Path(out) / f"rank{rank}.pt")
        if dist.is_initialized() and not case.endswith("peer"):
            dist.destroy_process_group()
    # Leave without the interpreter's teardown, where torch's own c10d globals and their
    # threads go in no fixed order (a rank once aborted there on torch 2.14); a crash
    # in the collectives or in destroy_process_group above still fails the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _relay(values: Any, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device="relay")


def collectives(rank: int, world: int) -> dict[str, Any]:
    """Each collective c10d offers, on relay tensors, against its definition: a list of
    (name, got, expected) for the test to compare, all on the CPU."""
    checks: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def check(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
        checks.append((name, got.detach().cpu(), expected.detach().cpu()))

    ranks = torch.arange(world, dtype=torch.float64)
    mine = _relay([rank + 1.0, 10.0 * (rank + 1)])
    total = torch.tensor([sum(range(1, world + 1)), 10.0 * sum(range(1, world + 1))])

    x = mine.clone()
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    check("all_reduce", x, total)
    future_value = work.get_future().value()[0]
    check("all_reduce future value", future_value, total)
    checks.append(
        (
            "future value on relay",
            torch.tensor(future_value.device.type == "relay"),
            torch.tensor(True),
        )
    )
    x = mine.clone()
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    check("all_reduce max", x, torch.tensor([world, 10.0 * world]))
    x = mine.clone()
    dist.broadcast(x, src=world - 1)
    check("broadcast", x, torch.tensor([world, 10.0 * world]))
    x = mine.clone()
    dist.reduce(x, dst=0)
    if rank == 0:
        check("reduce", x, total)
    gathered = [torch.empty(2, dtype=torch.float64, device="relay") for _ in range(world)]
    dist.all_gather(gathered, mine)
    check("all_gather", torch.stack(gathered), torch.stack([(ranks + 1), 10 * (ranks + 1)], 1))
    flat = torch.empty(2 * world, dtype=torch.float64, device="relay")
    dist.all_gather_into_tensor(flat, mine)
    check("all_gather_into_tensor", flat, torch.stack([ranks + 1, 10 * (ranks + 1)], 1).flatten())
    out = torch.empty(1, dtype=torch.float64, device="relay")
    dist.reduce_scatter(out, [_relay([float(rank * world + i)]) for i in range(world)])
    check("reduce_scatter", out, torch.tensor([sum(r * world + rank for r in range(world))]))
    out = torch.empty(1, dtype=torch.float64, device="relay")
    dist.reduce_scatter_tensor(out, _relay([float(rank * world + i) for i in range(world)]))
    check("reduce_scatter_tensor", out, torch.tensor([sum(r * world + rank for r in range(world))]))
    # The whole tensor in any shape of the right size, as NCCL takes it: stacked, or
    # one row (SyncBatchNorm gathers into a (1, world * n) tensor on every engine but gloo).
    gathered_by_rank = torch.stack([ranks + 1, 10 * (ranks + 1)], 1)
    for shape in ((world, 2), (1, 2 * world)):
        whole = torch.empty(shape, dtype=torch.float64, device="relay")
        dist.all_gather_into_tensor(whole, mine)
        check(f"all_gather_into_tensor {shape}", whole, gathered_by_rank.reshape(shape))
        spread = _relay([[float(r * world + rank + i) for i in range(2)] for r in range(world)])
        out = torch.empty(2, dtype=torch.float64, device="relay")
        dist.reduce_scatter_tensor(out, spread.reshape(shape))
        summed = [sum(float(rank * world + r + i) for r in range(world)) for i in range(2)]
        check(f"reduce_scatter_tensor {shape}", out, torch.tensor(summed))
    outputs = [torch.empty(1, dtype=torch.float64, device="relay") for _ in range(world)]
    dist.all_to_all(outputs, [_relay([float(rank * 100 + i)]) for i in range(world)])
    check("all_to_all", torch.cat(outputs), torch.tensor([r * 100.0 + rank for r in range(world)]))
    out = torch.empty(world, dtype=torch.float64, device="relay")
    dist.all_to_all_single(out, _relay([float(rank * 100 + i) for i in range(world)]))
    check("all_to_all_single", out, torch.tensor([r * 100.0 + rank for r in range(world)]))
    gather_list = [torch.empty(2, dtype=torch.float64, device="relay") for _ in range(world)]
    dist.gather(mine, gather_list if rank == 0 else None, dst=0)
    if rank == 0:
        check("gather", torch.stack(gather_list), torch.stack([ranks + 1, 10 * (ranks + 1)], 1))
    out = torch.empty(2, dtype=torch.float64, device="relay")
    pieces = [_relay([float(i), -float(i)]) for i in range(world)] if rank == 0 else None
    dist.scatter(out, pieces, src=0)
    check("scatter", out, torch.tensor([float(rank), -float(rank)]))
    if world > 1:
        buffer = _relay([0.0, 0.0])
        if rank == 0:
            dist.send(_relay([7.0, 8.0]), dst=1)
        elif rank == 1:
            dist.recv(buffer, src=0)
            check("send/recv", buffer, torch.tensor([7.0, 8.0]))
        peer = (rank + 1) % world
        incoming = _relay([0.0])
        requests = dist.batch_isend_irecv(
            [
                dist.P2POp(dist.isend, _relay([float(rank)]), peer),
                dist.P2POp(dist.irecv, incoming, (rank - 1) % world),
            ]
        )
        for request in requests:
            request.wait()
        check("batch_isend_irecv", incoming, torch.tensor([float((rank - 1) % world)]))
    coalesced = [mine.clone(), mine.clone() * 2]
    dist.all_reduce_coalesced(coalesced)
    check("all_reduce_coalesced", torch.stack(coalesced), torch.stack([total, 2 * total]))
    objects: list[Any] = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    checks.append(
        ("all_gather_object", torch.tensor([o["rank"] for o in objects]), torch.arange(world))
    )
    dist.barrier()
    config = str(dist.get_backend_config())
    if "cpu:" in config:  # init_process_group() with no backend serves the accelerator only
        cpu = torch.tensor([1.0 + rank])
        dist.all_reduce(cpu)
        check("all_reduce of a CPU tensor", cpu, torch.tensor([float(sum(range(1, world + 1)))]))
    return {"checks": checks, "backend": config}


class Net(nn.Module):
    """Linear layers with a branch that the forward may skip (find_unused_parameters)."""

    def __init__(self, uses_all: bool = True) -> None:
        super().__init__()
        self.uses_all = uses_all
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.ReLU())
        self.head = nn.Linear(16, 3)
        self.unused = nn.Linear(16, 3)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        h = self.body(x)
        return self.head(h) + (self.unused(h) if self.uses_all else 0)


def make_data() -> tuple[dict[str, torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The initial weights and STEPS global batches, the same in every process."""
    torch.manual_seed(0)
    state = Net().double().state_dict()
    gen = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(BATCH, 6, generator=gen, dtype=torch.float64),
            torch.randn(BATCH, 3, generator=gen, dtype=torch.float64),
        )
        for _ in range(STEPS)
    ]
    return state, batches


def reference_training(variant: str) -> dict[str, torch.Tensor]:
    """One process, the whole global batch per step (mean loss), eager on the CPU."""
    state, batches = make_data()
    accumulate = 2 if variant == "no_sync" else 1
    model = Net(uses_all=variant != "find_unused_parameters").double()
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        optimizer.zero_grad()
        for part_x, part_y in zip(x.chunk(accumulate), y.chunk(accumulate), strict=True):
            (nn.functional.mse_loss(model(part_x), part_y) / accumulate).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


DDP_VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "gradient_as_bucket_view": {"gradient_as_bucket_view": True},
    "small_buckets": {"bucket_cap_mb": 0.0001},
    "find_unused_parameters": {"find_unused_parameters": True},
    "static_graph": {"static_graph": True},
    "fp16_compress_hook": {},
    "bf16_compress_hook": {},
    "no_sync": {},
    "zero_redundancy_optimizer": {},
}


def ddp(rank: int, world: int, variant: str) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    state, batches = make_data()
    model = Net(uses_all=variant != "find_unused_parameters").double()
    model.load_state_dict(state)
    model.to("relay")
    options = DDP_VARIANTS[variant]
    wrapped = DistributedDataParallel(model, **options)
    if variant.endswith("compress_hook"):
        hook = getattr(default_hooks, variant)
        wrapped.register_comm_hook(None, hook)
    if variant == "zero_redundancy_optimizer":  # each rank steps its shard, then broadcasts
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(
            wrapped.parameters(), optimizer_class=torch.optim.SGD, lr=0.1, momentum=0.9
        )
    else:
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        mine_x, mine_y = x.chunk(world)[rank].to("relay"), y.chunk(world)[rank].to("relay")
        optimizer.zero_grad()
        if variant == "no_sync":
            # two micro-batches: the first accumulates locally, the second synchronizes
            halves = list(zip(mine_x.chunk(2), mine_y.chunk(2), strict=True))
            with wrapped.no_sync():
                (nn.functional.mse_loss(wrapped(halves[0][0]), halves[0][1]) / 2).backward()
            (nn.functional.mse_loss(wrapped(halves[1][0]), halves[1][1]) / 2).backward()
        else:
            nn.functional.mse_loss(wrapped(mine_x), mine_y).backward()
        optimizer.step()
    logged = wrapped._get_ddp_logging_data()  # DDP's runtime statistics need relay's timer
    return {
        "parameters": {n: p.detach().cpu() for n, p in model.named_parameters()},
        "forward_time_ns": logged.get("avg_forward_compute_time", 0),
        "devices": sorted({p.device.type for p in model.parameters()}),
        "grad_devices": sorted(
            {p.grad.device.type for p in model.parameters() if p.grad is not None}
        ),
    }


def train_on_my_shard(
    model: nn.Module,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    rank: int,
    world: int,
    device: str = "relay",
) -> None:
    """SGD steps of a sharded model, each rank on its part of every global batch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches:
        optimizer.zero_grad()
        mine_x, mine_y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        nn.functional.mse_loss(model(mine_x), mine_y).backward()
        optimizer.step()


def fsdp2(rank: int, world: int) -> dict[str, Any]:
    """FSDP2 (fully_shard per linear layer and at the root) over a relay device mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    state, batches = make_data()
    model = Net().double()
    model.load_state_dict(state)
    model.to("relay")
    mesh = init_device_mesh("relay", (world,))
    for layer in [*model.body, model.head, model.unused]:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train_on_my_shard(model, batches, rank, world)
    full = {n: p.full_tensor() for n, p in model.named_parameters()}  # type: ignore[attr-defined]
    return {
        "parameters": {n: t.detach().cpu() for n, t in full.items()},
        "devices": sorted({t.device.type for t in full.values()}),
        "grad_devices": ["relay"],
    }


def fsdp1(rank: int, world: int) -> dict[str, Any]:
    """FSDP1 (FullyShardedDataParallel, one flat parameter per linear layer), which
    records its shards on relay's streams (Tensor.record_stream) as on CUDA's."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    state, batches = make_data()
    model = Net().double()
    model.load_state_dict(state)
    model = FullyShardedDataParallel(
        model,
        device_id=torch.device("relay", torch.relay.current_device()),  # type: ignore[attr-defined]
        auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        use_orig_params=True,
    )
    train_on_my_shard(model, batches, rank, world)
    with FullyShardedDataParallel.summon_full_params(model):
        full = {
            n.replace("_fsdp_wrapped_module.", ""): p.detach().cpu().clone()
            for n, p in model.named_parameters()
        }
        devices = sorted({p.device.type for p in model.parameters()})
    return {"parameters": full, "devices": devices}


def lost_peer(rank: int, world: int, dies: bool) -> dict[str, Any]:
    """Rank 1 never joins the all_reduce, stalling past the timeout or dying: rank 0 gets
    the engine's error (timeout, or the closed connection) instead of hanging."""
    dist.barrier()  # both ranks connected before one goes missing
    if rank == 1:
        if dies:
            os._exit(0)
        time.sleep(TIMEOUT_S * 3)
        return {}
    x = _relay([1.0])
    started = time.monotonic()
    try:
        dist.all_reduce(x)
    except Exception as error:
        raised = f"{type(error).__name__}: {error}"
    else:
        raised = None
    return {"raised": raised, "seconds": time.monotonic() - started}


def mixed_homes(rank: int, world: int) -> dict[str, Any]:
    """One tensor in GPU memory, one in host memory, in one collective: refused clearly."""
    import torch_fallback.relay

    on_gpu = _relay([1.0])
    with torch_fallback.relay.home("cpu"):
        on_host = _relay([2.0])
    dist.all_reduce_coalesced([on_gpu, on_host])
    return {}


def dtensor_random(rank: int, world: int) -> dict[str, Any]:
    """DTensor's random ops on a relay mesh, twice from the same seed: a sharded and a
    replicated draw, dropout of a sharded tensor, nn.init with a relay generator, a plain
    draw after them, and a model made on the meta device, sharded (FSDP2), then given
    its parameters by reset_parameters()."""
    import torch.distributed.tensor as dtensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("relay", (world,))
    rows = 4 * world

    def draws() -> dict[str, torch.Tensor]:
        torch.manual_seed(5)  # on every rank, as DTensor asks
        sharded = dtensor.randn(rows, 3, device_mesh=mesh, placements=[Shard(0)])
        sharded_again = dtensor.randn(rows, 3, device_mesh=mesh, placements=[Shard(0)])
        replicated = dtensor.rand(5, device_mesh=mesh, placements=[Replicate()])
        ones = distribute_tensor(torch.ones(rows, 64, device="relay"), mesh, [Shard(0)])
        dropped = nn.functional.dropout(ones, 0.5)
        generator = torch.Generator("relay").manual_seed(7)
        initialized = dtensor.empty(rows, 3, device_mesh=mesh, placements=[Shard(0)])
        nn.init.normal_(initialized, generator=generator)
        after = torch.rand(3, device="relay")
        local = {
            "sharded": sharded.to_local(),
            "sharded_again": sharded_again.to_local(),
            "replicated": replicated.to_local(),
            "dropped": dropped.to_local(),
            "initialized": initialized.to_local(),
            "after": after,
        }
        return {name: t.detach().cpu() for name, t in local.items()}

    torch.manual_seed(11)
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(8, 4 * world), nn.Linear(4 * world, 2))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="relay")
    for layer in model:
        layer.reset_parameters()
    model(torch.randn(3, 8, device="relay")).sum().backward()
    return {
        "first": draws(),
        "second": draws(),
        "fsdp_local": {n: p.to_local().detach().cpu() for n, p in model.named_parameters()},
        "fsdp_grads_finite": all(
            bool(p.grad.full_tensor().isfinite().all()) for p in model.parameters()
        ),
    }


class NormNet(nn.Module):
    """A convolution, BatchNorm and a head: SyncBatchNorm's model once converted."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.conv(x)).relu().mean((2, 3)))


def norm_batches(channels_last: bool) -> tuple[dict[str, torch.Tensor], list]:
    torch.manual_seed(0)
    state = NormNet().double().state_dict()
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 2, 5, 5, generator=gen, dtype=torch.float64)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        batches.append((x, torch.randn(BATCH, 3, generator=gen, dtype=torch.float64)))
    return state, batches


def state_on_cpu(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().cpu() for name, t in model.state_dict().items()}


def norm_reference(channels_last: bool) -> dict[str, torch.Tensor]:
    """BatchNorm in one process over the global batch, eager on the CPU."""
    state, batches = norm_batches(channels_last)
    model = NormNet().double()
    model.load_state_dict(state)
    train_on_my_shard(model, batches, rank=0, world=1, device="cpu")
    return state_on_cpu(model)


def sync_batchnorm(rank: int, world: int, channels_last: bool) -> dict[str, Any]:
    """SyncBatchNorm under DDP, each rank on its part of every global batch."""
    from torch.nn.parallel import DistributedDataParallel

    state, batches = norm_batches(channels_last)
    model = NormNet().double()
    model.load_state_dict(state)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model).to("relay")
    train_on_my_shard(DistributedDataParallel(model), batches, rank, world)
    return {
        "state": state_on_cpu(model),
        "devices": sorted({t.device.type for t in model.state_dict().values()}),
    }


def monitored_barrier(rank: int, world: int) -> dict[str, Any]:
    """monitored_barrier on the default group, which relaycc runs on gloo underneath
    unless PyTorch's own check refuses a backend not named gloo first, and on a CPU
    group of its own (the documented way round that check)."""
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
        outcome = "passed"
    except ValueError as error:
        outcome = f"refused: {error}"
    # relaycc's own, past PyTorch's check
    relaycc = dist.distributed_c10d._get_default_group()._get_backend(torch.device("relay"))
    relaycc.monitored_barrier(datetime.timedelta(seconds=30), True)
    cpu_group = dist.new_group(backend="gloo")
    dist.monitored_barrier(group=cpu_group, timeout=datetime.timedelta(seconds=30))
    return {"outcome": outcome, "passed_relaycc": True, "passed_cpu_group": True}


CASES: dict[str, Callable[[int, int], dict[str, Any]]] = {
    "collectives": collectives,
    "stalled-peer": lambda r, w: lost_peer(r, w, dies=False),
    "dead-peer": lambda r, w: lost_peer(r, w, dies=True),
    "mixed-homes": mixed_homes,
    "monitored-barrier": monitored_barrier,
    "fsdp1": fsdp1,
    "fsdp2": fsdp2,
    "dtensor-random": dtensor_random,
    "sync-batchnorm": lambda r, w: sync_batchnorm(r, w, channels_last=False),
    "sync-batchnorm-channels-last": lambda r, w: sync_batchnorm(r, w, channels_last=True),
    **{
        f"ddp-{variant}": (lambda v: lambda r, w: ddp(r, w, v))(variant) for variant in DDP_VARIANTS
    },
}
