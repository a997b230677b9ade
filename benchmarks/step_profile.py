"""Where a training step's time goes, relay against native: the profiler's breakdown.

For one model and dtype of training_workloads.py, each side (its own process; the
native side never imports torch_fallback, pytorch/pytorch#161129) reports:
  wall       median ms of a step, synchronized
  host       median ms to issue a step (no synchronize; the GPU may still run), and of
             each phase: zero_grad, forward, backward, optimizer step
  gpu        ms of GPU kernels per step and their count (torch.profiler, CUDA only)
  kernels    the GPU kernels by total time, to spot a different kernel choice
  ops        host time per aten op (self CPU time, torch.profiler)
  fallback   relay only: calls and ms inside the fallback per op (torch_fallback.metrics)

    python benchmarks/step_profile.py --device cuda --model cnn --json p.json
    python benchmarks/step_profile.py --device cpu --small --model transformer

--json writes the summary (per side: the medians, the quartiles of wall and host ms, the
profiles); --raw adds every step's times.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import harness
import training_workloads as workloads

TOP = 12


PHASES = ("zero_grad", "forward", "backward", "optimizer")


def issue_and_wall_ms(step, sync, repeats: int, raw: bool = False) -> dict:
    """Median ms to issue a step and to finish it (and quartiles), and to issue each of
    its phases; raw: every step's figures too."""
    samples: dict[str, list[float]] = {key: [] for key in ("issue_ms", "wall_ms", *PHASES)}
    for _ in range(repeats):
        sync()
        marks = [time.perf_counter()]
        step(marks)
        sync()
        samples["wall_ms"].append((time.perf_counter() - marks[0]) * 1e3)
        samples["issue_ms"].append((marks[-1] - marks[0]) * 1e3)
        for phase, (begin, end) in zip(PHASES, itertools.pairwise(marks), strict=True):
            samples[phase].append((end - begin) * 1e3)
    summaries = {key: harness.summarize(values) for key, values in samples.items()}
    out: dict = {key: summary["median"] for key, summary in summaries.items()}
    out |= {f"{key}_quartiles": summaries[key]["quartiles"] for key in ("issue_ms", "wall_ms")}
    if raw:
        out["samples_ms"] = samples
    return out


def profile(step, sync, uses_cuda: bool, steps: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if uses_cuda else [])
    with torch_profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    ops: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        # Where a PrivateUse1 backend is registered, the profiler files GPU
        # activity under PrivateUse1 (profiler_kineto's deviceTypeFromActivity).
        if event.device_type.name in ("CUDA", "PrivateUse1"):
            entry = kernels.setdefault(event.name[:60], [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time / 1e3 / steps
        elif event.name.startswith("aten::"):
            ops[event.name] = ops.get(event.name, 0.0) + event.self_cpu_time_total / 1e3 / steps
    return {
        "gpu_ms": sum(v[1] for v in kernels.values()),
        "gpu_kernels": sum(v[0] for v in kernels.values()) / steps,
        "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1][1])),
        "ops_ms": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:TOP]),
        "ops_total_ms": sum(ops.values()),
    }


def side_main(args: argparse.Namespace) -> int:
    uses_cuda = args.device == "cuda"
    device = args.device
    fallback = None
    if args.side == "relay":
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target(args.device)
        torch_fallback.set_cuda_sync("stream")
        torch_fallback.relay.set_home(args.device)
        device, fallback = "relay", torch_fallback
    spec = {"name": args.model, "dtype": args.dtype, "device": device, "config": args.side}
    sync = workloads.make_sync(uses_cuda)
    _, step = workloads.train_step(spec, args, sync)  # warms up for args.budget seconds
    row = {"side": args.side, **issue_and_wall_ms(step, sync, args.repeats, args.raw)}
    row |= profile(step, sync, uses_cuda, steps=3)
    if fallback is not None:
        fallback.reset_metrics()
        step()
        sync()
        per_op = sorted(fallback.metrics().items(), key=lambda kv: -kv[1].time_ns)
        row["fallback_calls"] = sum(m.calls for _, m in per_op)
        row["fallback_ms"] = sum(m.time_ns / 1e6 for _, m in per_op)
        row["fallback"] = {name: [m.calls, m.time_ns / 1e6] for name, m in per_op[:TOP]}
    harness.emit(row)
    return 0


def kernel_differences(native: dict, relay: dict) -> list[tuple[str, tuple[list, list]]]:
    """Kernels run a different number of times per step, or >10% (and 5 us) longer, on
    one side: a different kernel choice, or an extra copy, shows up here."""
    differing = []
    for name in native.keys() | relay.keys():
        n, r = native.get(name, [0, 0.0]), relay.get(name, [0, 0.0])
        if n[0] != r[0] or abs(n[1] - r[1]) > max(0.1 * max(n[1], r[1]), 0.005):
            differing.append((name, (n, r)))
    return sorted(differing, key=lambda item: -abs(item[1][1][1] - item[1][0][1]))


def render(rows: dict[str, dict], meta: dict) -> str:
    native, relay = rows["native"], rows["relay"]
    lines = [f"{meta['model']} {meta['dtype']}, device {meta['device']}, torch {meta['torch']}"]
    lines.append(f"{'per step':<34}{'native':>10}{'relay':>10}{'relay-native':>14}")
    phases = [(phase, f"  of which {phase.replace('_', ' ')}") for phase in PHASES]
    for key, label in [("wall_ms", "wall ms (synchronized)"), ("issue_ms", "host ms to issue"),
                       *phases, ("gpu_ms", "GPU kernel ms"), ("gpu_kernels", "GPU kernels"),
                       ("ops_total_ms", "aten self CPU ms (profiled)")]:  # fmt: skip
        a, b = native[key], relay[key]
        lines.append(f"{label:<34}{a:>10.3f}{b:>10.3f}{b - a:>+14.3f}")
    lines.append(f"fallback: {relay['fallback_calls']} calls, {relay['fallback_ms']:.3f} ms inside")
    for title, key in [("GPU kernels by time (count, ms)", "kernels"),
                       ("aten ops by self CPU ms", "ops_ms")]:  # fmt: skip
        for side, row in rows.items():
            lines.append(f"\n{side}: {title}")
            for name, value in list(row[key].items())[:TOP]:
                counted = isinstance(value, list)
                shown = f"{value[0]:6.0f} {value[1]:8.3f}" if counted else f"{value:8.3f}"
                lines.append(f"  {name:<62}{shown}")
    differing = kernel_differences(native["kernels"], relay["kernels"])
    lines.append("\nGPU kernels one side runs more often or longer (native, relay: count, ms)")
    for name, (n, r) in differing[:TOP]:
        lines.append(f"  {name:<62}{n[0]:6.0f} {n[1]:8.3f} {r[0]:6.0f} {r[1]:8.3f}")
    if not differing:
        lines.append("  none: the same kernels, as often, within 10% of each other's time")
    lines.append("\nrelay: fallback ops by time inside the fallback (calls, ms)")
    for name, (calls, ms) in relay["fallback"].items():
        lines.append(f"  {name:<62}{calls:6d} {ms:8.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--model", choices=sorted(workloads.MODELS), default="cnn")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--small", action="store_true", help="small models (for CPU hosts)")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds of warm-up steps")
    harness.add_output_options(parser)
    parser.add_argument("--side", choices=("native", "relay"), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)
    if args.side:
        return side_main(args)
    forwarded = list(argv if argv is not None else sys.argv[1:])
    rows = {side: harness.run_side(__file__, side, forwarded) for side in ("native", "relay")}
    import torch

    meta = {"model": args.model, "dtype": args.dtype, "device": args.device,
            "repeats": args.repeats, **harness.host_info(torch)}  # fmt: skip
    harness.write_outputs(args, {"meta": meta, "rows": rows}, render(rows, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
