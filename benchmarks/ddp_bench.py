"""A DistributedDataParallel training step: relay (relaycc over NCCL) against native CUDA
(NCCL), with an A/A control, on N GPUs.

Three groups of N rank processes live side by side for the whole run: native (never
imports torch_fallback: pytorch/pytorch#161129), relay (CUDA home and target) and
control (a second native group). Each round asks every group for one measurement
of each model in turn, in an order that rotates from round to round; a row's
figure is the median of its per-round relay/native ratios. The models are the
training bench's CNN and Transformer (training_workloads.py), float32.

    python benchmarks/ddp_bench.py --nproc 2 --rounds 16 --json ddp.json
    python benchmarks/ddp_bench.py --nproc 1   # one GPU: world size 1, and it says so

--json writes the summary (medians, ratios and their quartiles, host and GPU); --raw
adds each round's figures.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
from typing import Any

import harness

SIDES = ("native", "relay", "control")
MODELS = ("cnn", "transformer")


def rank_main(side: str, rank: int, world: int, port: int, args: dict, pipe: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist
    import training_workloads as work
    from torch.nn.parallel import DistributedDataParallel

    device = "cuda"
    if side == "relay":
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target("cuda")
        torch_fallback.relay.set_home("cuda")
        torch.relay.set_device(rank)
        device = "relay"
    torch.cuda.set_device(rank)
    backend = "relaycc" if side == "relay" else "nccl"
    dist.init_process_group(backend, rank=rank, world_size=world)
    sync = torch.cuda.synchronize
    steps = {}
    for name in MODELS:
        torch.manual_seed(0)
        model, inputs, labels = work.MODELS[name](args["small"])
        model = DistributedDataParallel(model.to(device))
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

        def step(model=model, inputs=inputs, labels=labels, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()

        steps[name] = step
    while True:
        command = [pipe.recv() if rank == 0 else None]
        dist.broadcast_object_list(command, src=0)
        if command[0] is None:
            break
        dist.barrier()
        timed = harness.time_calls(steps[command[0]], sync, args["budget"], max_repeats=200)
        if rank == 0:
            pipe.send(timed.median)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=None, help="ranks per side (default: GPUs)")
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--budget", type=float, default=0.3, help="seconds per measurement")
    parser.add_argument("--small", action="store_true", help="the training bench's small sizes")
    harness.add_output_options(parser)
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        print("ddp_bench needs CUDA GPUs: torch.cuda.device_count() is 0", file=sys.stderr)
        return 2
    nproc = args.nproc or gpus
    if nproc > gpus:
        print(f"--nproc {nproc} but {gpus} GPU(s) are visible", file=sys.stderr)
        return 2
    note = "world size 1: one GPU, no communication between GPUs" if nproc == 1 else ""
    if note:
        print(f"ddp_bench: {note}", file=sys.stderr)
    context = mp.get_context("spawn")
    options = {"budget": args.budget, "small": args.small}
    pipes, processes = {}, []
    for offset, side in enumerate(SIDES):
        parent_end, child_end = context.Pipe()
        pipes[side] = parent_end
        for rank in range(nproc):
            process = context.Process(
                target=rank_main,
                args=(side, rank, nproc, 29600 + offset, options, child_end if rank == 0 else None),
            )
            process.start()
            processes.append(process)
    times: dict[str, dict[str, list[float]]] = {s: {m: [] for m in MODELS} for s in SIDES}
    for round_index in range(args.rounds):
        order = harness.rotated(SIDES, round_index)
        for name in MODELS:
            for side in order:
                pipes[side].send(name)
                times[side][name].append(pipes[side].recv())
        print(f"round {round_index + 1}/{args.rounds}", file=sys.stderr, flush=True)
    for side in SIDES:
        pipes[side].send(None)
    for process in processes:
        process.join()
    rows = []
    for name in MODELS:
        native = times["native"][name]
        ratio = {s: harness.summarize(harness.paired(times[s][name], native)) for s in SIDES[1:]}
        rows.append(
            {
                "model": name,
                "native_ms": statistics.median(native),
                "relay_ms": statistics.median(times["relay"][name]),
                "relay_ratio": ratio["relay"]["median"],
                "relay_quartiles": ratio["relay"]["quartiles"],
                "control_ratio": ratio["control"]["median"],
                "control_quartiles": ratio["control"]["quartiles"],
            }
        )
    meta = {
        "nproc": nproc,
        "rounds": args.rounds,
        "budget_s": args.budget,
        **harness.host_info(torch),
        "note": note,
        "command": " ".join(["python", "benchmarks/ddp_bench.py", *(argv or sys.argv[1:])]),
    }
    result: dict[str, Any] = {"meta": meta, "rows": rows}
    if args.raw:  # each round's ms per side and model
        result["rounds_ms"] = times
    harness.write_outputs(args, result, render(result))
    return 0


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"DDP training step, {meta['nproc']} rank(s) per side, median of {meta['rounds']} "
        f"rounds {meta['note']}",
        "| model | native ms | relay ms | relay/native | control |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['model']} | {row['native_ms']:.2f} | {row['relay_ms']:.2f} "
            f"| {row['relay_ratio']:.2f} | {row['control_ratio']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
