"""What a fallback call costs inside a real model, not only in a loop: mispredicted
branches and cache misses as well as instructions.

A 1K-element add in a loop runs the same fallback code on the same arguments call after
call: its code and data stay in the CPU's caches (the second level at least) and the
branch predictor learns its branches. In a model's forward, other code (GEMM kernels,
the Python interpreter) runs between two fallback calls, and each call differs from the
one before. For each workload (a zoo model's float32 inference forward, and `add`, the
loop of overhead_profile.py), relay with CPU target and home against native CPU, one
thread:

Forwards run under torch.no_grad; with --inference-mode, every step runs under
torch.inference_mode.

(a) callgrind with its cache and branch simulation, switched on only around --steps
    steps: instructions (Ir), L1 instruction and data read misses (I1mr, D1mr) and
    mispredicted branches, conditional and indirect (Bcm, Bim); per step and per
    fallback call, relay minus native; and the same for the fallback's own code alone
    (OWN_OBJECTS), whose counts repeat from run to run where the interpreter's and the
    heap's share does not. The simulation has L1 caches of the host's sizes (the output
    files' `desc:` lines) and a last level, no second level: a loop misses L1 as often,
    but not the second level.
(b) time in one process: native, relay and a second native copy (the A/A control) take
    turns step by step, the order rotating; the median of the per-step ratios, and
    relay's added microseconds per step and per fallback call. The same process holds
    both sides: on the CPU that is sound (the reason other benchmarks keep native CUDA in
    its own process, pytorch/pytorch#161129, is CUDA autograd).

    python benchmarks/model_call_profile.py --workloads add,bert,resnet,llama --json r.json

--json writes the summary; --table the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import callgrind_runner
import harness

EVENTS = ("Ir", "I1mr", "D1mr", "Bcm", "Bim")
# The fallback's own code: torch_fallback's and relay's libraries, the c10 functions they
# call and the loader's thread-local lookups. Unlike the interpreter's and the heap's
# share of relay's extra cost, which move by hundreds of instructions per call from run
# to run, its counts repeat.
OWN_OBJECTS = ("/torch_fallback/", "/libc10.so", "/ld-linux")
OWN_EVENTS = ("Ir", "I1mr", "D1mr")
LOOP = "add"  # a 1K-element add, the loop overhead_profile.py measures


def build_step(workload: str, device: str, inference_mode: bool = False):
    """A no-argument callable running one step of `workload` on `device`: a model's
    forward under torch.no_grad (torch.inference_mode with `inference_mode`), or an add
    (in torch.inference_mode with `inference_mode`)."""
    import torch

    if workload == LOOP:
        a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
        if not inference_mode:
            return lambda: torch.add(a, b)

        def add_in_inference_mode() -> None:
            with torch.inference_mode():
                torch.add(a, b)

        return add_in_inference_mode
    import zoo_bench

    zoo = zoo_bench.load_zoo()
    model, case = zoo.make_case(workload, 1)
    model = model.to(device=device, dtype=torch.float32).eval()
    inputs = zoo_bench.moved(case["eval"], device, torch.float32)

    grad_off = torch.inference_mode if inference_mode else torch.no_grad

    def forward() -> None:
        with grad_off():
            model(**inputs)

    return forward


def relay_device() -> str:
    import torch_fallback
    import torch_fallback.relay

    torch_fallback.set_target("cpu")
    torch_fallback.relay.set_home("cpu")
    return "relay"


def fallback_calls_per_step(step) -> int:
    import torch_fallback

    torch_fallback.reset_metrics()
    step()
    return sum(m.calls for m in torch_fallback.metrics().values())


def callgrind_child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    device = relay_device() if args.side == "relay" else "cpu"
    step = build_step(args.workload, device, args.inference_mode)
    for _ in range(10):
        step()
    callgrind_runner.ready(args.workdir)
    for _ in range(args.steps):
        step()
    callgrind_runner.done(args.workdir)
    return 0


def timing_child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    steps = {"native": build_step(args.workload, "cpu", args.inference_mode)}
    steps["relay"] = build_step(args.workload, relay_device(), args.inference_mode)
    steps["control"] = build_step(args.workload, "cpu", args.inference_mode)
    calls = fallback_calls_per_step(steps["relay"])
    repeat = 100 if args.workload == LOOP else 1  # a loop step is too short to time alone
    for step in steps.values():
        for _ in range(10):
            step()
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for index in range(args.timed_steps):
        for name in harness.rotated(list(steps), index):
            start = time.perf_counter()
            for _ in range(repeat):
                steps[name]()
            seconds[name].append((time.perf_counter() - start) / repeat)
    harness.emit({"fallback_calls_per_step": calls, "seconds": seconds})
    return 0


def measure(workload: str, args: argparse.Namespace, workdir: Path) -> dict:
    row: dict = {"workload": workload}
    mode = ["--inference-mode"] if args.inference_mode else []
    timing = harness.run_side(
        __file__, "timing", ["--timing-child", f"--workload={workload}",
                             f"--timed-steps={args.timed_steps}", *mode],
    )  # fmt: skip
    calls = timing["fallback_calls_per_step"]
    s = timing["seconds"]
    row["fallback_calls_per_step"] = calls
    row["native_us"] = statistics.median(s["native"]) * 1e6
    row["relay_us"] = statistics.median(s["relay"]) * 1e6
    paired = harness.summarize(harness.paired(s["relay"], s["native"]))
    control = harness.summarize(harness.paired(s["control"], s["native"]))
    row["paired_ratio"], row["paired_quartiles"] = paired["median"], paired["quartiles"]
    row["control_paired_ratio"] = control["median"]
    row["control_paired_quartiles"] = control["quartiles"]
    added_us = [(r - n) * 1e6 for r, n in zip(s["relay"], s["native"], strict=True)]
    row["added_us_per_step"] = statistics.median(added_us)
    row["added_us_per_call"] = row["added_us_per_step"] / calls
    if args.no_callgrind:
        return row
    steps = args.loop_steps if workload == LOOP else args.steps
    events, own = {}, {}
    for side in ("native", "relay"):
        print(f"callgrind: {workload}, {side} side, {steps} steps", file=sys.stderr)
        argv = ["--callgrind-child", f"--side={side}", f"--workload={workload}", f"--steps={steps}"]
        argv += mode
        out = callgrind_runner.run(__file__, argv, workdir, f"{workload}.{side}",
                                   callgrind_runner.CACHE_AND_BRANCHES)  # fmt: skip
        totals = callgrind_runner.event_totals(out)
        events[side] = {name: totals[name] / steps for name in EVENTS}
        own[side] = own_totals(callgrind_runner.event_totals_by_object(out), steps)
    row["per_step"] = events
    row["added_per_call"] = {
        name: (events["relay"][name] - events["native"][name]) / calls for name in EVENTS
    }
    row["own_added_per_call"] = {
        name: (own["relay"][name] - own["native"][name]) / calls for name in OWN_EVENTS
    }
    return row


def own_totals(by_object: dict[str, dict[str, int]], steps: int) -> dict[str, float]:
    """Per step, the events of the objects OWN_OBJECTS names."""
    mine = [costs for obj, costs in by_object.items() if any(o in obj for o in OWN_OBJECTS)]
    return {name: sum(costs.get(name, 0) for costs in mine) / steps for name in OWN_EVENTS}


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"torch {meta['torch']}, relay CPU target and home against native CPU, 1 thread, "
        f"forwards under {meta.get('grad_mode', 'no_grad')}, {meta['date']}, "
        f"source {meta.get('source')}, host CPU: {meta.get('cpu_model')}",
        "",
        "time, one process, steps taking turns: median us per step; paired: median (quartiles)"
        " of the per-step relay/native, A/A: the control's",
    ]
    head = (f"{'workload':<10} {'calls':>5} {'native us':>10} {'relay us':>10} "
            f"{'paired (quartiles)':>20} {'A/A (quartiles)':>19} {'+us/call':>9}")  # fmt: skip
    lines += [head, "-" * len(head)]
    for row in result["rows"]:
        q, c = row["paired_quartiles"], row["control_paired_quartiles"]
        paired = f"{row['paired_ratio']:.2f} ({q[0]:.2f}-{q[1]:.2f})"
        control = f"{row['control_paired_ratio']:.2f} ({c[0]:.2f}-{c[1]:.2f})"
        lines.append(
            f"{row['workload']:<10} {row['fallback_calls_per_step']:>5} {row['native_us']:>10.1f} "
            f"{row['relay_us']:>10.1f} {paired:>20} {control:>19} "
            f"{row['added_us_per_call']:>+9.2f}"
        )
    rows = [r for r in result["rows"] if "per_step" in r]
    if not rows:
        lines += ["", f"callgrind: {result.get('callgrind_note', 'not run')}"]
        return "\n".join(lines)
    lines += [
        "",
        "callgrind, cache and branch simulation: per fallback call, relay minus native "
        "(Ir instructions, I1mr/D1mr L1 instruction/data read misses, Bcm/Bim mispredicted "
        "conditional/indirect branches)",
    ]
    head = f"{'workload':<10} " + " ".join(f"{name:>8}" for name in EVENTS)
    head += f" {'native Ir/step':>15} {'relay Ir/step':>14}"
    lines += [head, "-" * len(head)]
    for row in rows:
        added = " ".join(f"{row['added_per_call'][name]:>+8.0f}" for name in EVENTS)
        lines.append(
            f"{row['workload']:<10} {added} {row['per_step']['native']['Ir']:>15,.0f} "
            f"{row['per_step']['relay']['Ir']:>14,.0f}"
        )
    rows = [r for r in rows if "own_added_per_call" in r]
    if rows:
        lines += [
            "",
            "the fallback's own code (torch_fallback and relay, the c10 functions they call, "
            "the loader's thread-local lookups): per fallback call, relay minus native",
        ]
        head = f"{'workload':<10} " + " ".join(f"{name:>8}" for name in OWN_EVENTS)
        lines += [head, "-" * len(head)]
        for row in rows:
            own = row["own_added_per_call"]
            lines.append(
                f"{row['workload']:<10} " + " ".join(f"{own[n]:>+8.0f}" for n in OWN_EVENTS)
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="add,bert,resnet,llama",
                        help=f"comma-separated: {LOOP} and zoo model names")  # fmt: skip
    parser.add_argument("--steps", type=int, default=5, help="model forwards under callgrind")
    parser.add_argument("--loop-steps", type=int, default=2000, help="adds under callgrind")
    parser.add_argument("--timed-steps", type=int, default=200, help="timed steps per side")
    parser.add_argument(
        "--inference-mode", action="store_true", help="steps under torch.inference_mode"
    )
    callgrind_runner.add_options(parser)
    harness.add_output_options(parser, raw=False)
    parser.add_argument("--from-json", help="only render the table of an earlier run")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--timing-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.timing_child:
        return timing_child(args)
    if args.callgrind_child:
        return callgrind_child(args)
    if args.from_json:
        print(render(json.loads(Path(args.from_json).read_text())))
        return 0
    import torch  # metadata only; the measurements run in child processes

    meta = {**harness.host_info(torch), "timed_steps": args.timed_steps}
    meta["grad_mode"] = "inference_mode" if args.inference_mode else "no_grad"
    meta.update(callgrind_steps=args.steps, loop_steps=args.loop_steps)
    result: dict = {"meta": meta}
    missing = callgrind_runner.missing_tools()
    if missing and not args.no_callgrind:
        args.no_callgrind = True
        result["callgrind_note"] = (
            f"skipped: {', '.join(missing)} not found (apt-get install valgrind)"
        )
    elif args.no_callgrind:
        result["callgrind_note"] = "skipped (--no-callgrind)"
    names = [name for name in args.workloads.split(",") if name]
    import zoo_bench

    known = [LOOP, *zoo_bench.load_zoo().BY_NAME]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        result["rows"] = [measure(name, args, workdir) for name in names]
    harness.write_outputs(args, result, render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
