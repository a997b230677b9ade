"""Where the time of one fallback call goes: 1K-element add on relay against native.

(a) Timing: N calls of torch.add on two 1K-element tensors, native (a process that
    never imports torch_fallback) and relay (fallback target and relay home cpu, or
    both cuda with --device cuda); median us per call over batches of 100 calls, and
    the fallback's own time per call from its metrics.
(b) Instruction counts (CPU only, when valgrind is installed): the same loop, native
    and relay, under callgrind with instrumentation switched on only around the loop
    (callgrind_control), then Ir per call per component. The script reads callgrind's
    output file itself (callgrind_costs.py: caller -> callee inclusive costs), so a
    component nested in another is counted once: each component's exclusive cost is
    its inclusive cost minus the components inside it; they add up to the total.

    python benchmarks/overhead_profile.py --json r.json --table r.txt

--json writes the summary (timing medians and quartiles, the components' Ir per call,
host); --raw adds every timing round with its per-batch samples.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import callgrind_runner
import harness
from callgrind_costs import component_tree, entered_cost, parse_callgrind

BATCH = 100
# The call tree of one relay add, outermost first: (key, parent, what, name patterns).
# A component's inclusive cost is what its functions cost when entered from outside it.
# relay's add runs through the unboxed kernel (DirectKernel, DirectCall); the boxed
# path's names (boxed_fallback, FallbackCall) are kept for ops without one.
COMPONENTS = [
    ("binding", "python", "Python binding (THPVariable_add: parse args, wrap result)",
     [r"^torch::autograd::THPVariable_add\b"]),
    ("dispatch", "binding", "dispatcher + autograd layer (add_Tensor::call)",
     [r"^at::_ops::add_Tensor::call\("]),
    ("fallback", "dispatch", "fallback kernel (DirectKernel and what it inlines)",
     [r"torch_fallback::detail::DirectKernel<", r"torch_fallback::boxed_fallback\(",
      r"torch_fallback::detail::fallback_kernel<"]),
    ("inner_dispatch", "fallback", "target dispatch (the CPU kernel's unboxed wrapper)",
     [r"wrap_kernel_functor_unboxed_<.*wrapper_CPU_", r"^c10::Dispatcher::callBoxed",
      r"^c10::OperatorHandle::callBoxed"]),
    ("kernel", "inner_dispatch", "CPU kernel (TensorIterator, output allocation)",
     [r"^at::\(anonymous namespace\)::wrapper_CPU_"]),
    ("setup", "fallback", "call setup (DirectCall, start: keys, target)",
     [r"DirectCall::(DirectCall|start)\("]),
    ("argument_walk", "fallback", "arguments onto the target (offer, pooled target views)",
     [r"DirectCall::(offer|on_target|view_of|kept_view_of)\(",
      r"FallbackCall::(to_target|move_arguments_to_target|for_each_tensor_argument)\b"]),
    ("returns", "fallback", "result adopted by the backend (finish, relay's adopt)",
     [r"DirectCall::(finish|to_backend)\(", r"FallbackCall::(to_backend|write_back\w*)\b"]),
    ("settings_metrics", "fallback", "settings + metrics (op_rules, record)",
     [r"^torch_fallback::(metrics::record|op_rules|OpRules::|forced_to_cpu|target\(\)|"
      r"cuda_sync|get_cpu_ops|settings)"]),
    ("teardown", "fallback", "teardown (~DirectCall: views parked, call recorded)",
     [r"DirectCall::~DirectCall", r"FallbackCall::~FallbackCall"]),
    ("release", "python", "result release (THPVariable_dealloc, storage deleters)",
     [r"^THPVariable_dealloc\b"]),
]  # fmt: skip
# Cross-cutting: reported inclusive, not part of the tree.
WRAPPING = [r"^torch_fallback::(tensor_over|backend_tensor_over)\(", r"TargetImplPool::",
            r"^torch_fallback::relay::adopt\(", r"home_storage\(", r"release_adopted",
            r"release_home_view"]  # fmt: skip
VISIBLE_NOTE = "not visible (inlined, or absent)"


def timing_child(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    device = "cuda" if args.device == "cuda" else "cpu"
    fallback_ns = None
    if args.side == "relay":
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target(device)
        torch_fallback.relay.set_home(device)
        device = "relay"
    sync = torch.cuda.synchronize if args.device == "cuda" else harness.no_sync
    a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
    add = torch.add
    for _ in range(1000):
        add(a, b)
    sync()
    if args.side == "relay":
        torch_fallback.reset_metrics()
    samples = []
    for _ in range(max(1, args.calls // BATCH)):
        start = time.perf_counter_ns()
        for _ in range(BATCH):
            add(a, b)
        sync()
        samples.append((time.perf_counter_ns() - start) / BATCH / 1e3)
    if args.side == "relay":
        m = torch_fallback.metrics()["aten::add.Tensor"]
        fallback_ns = m.time_ns / m.calls
    summary = harness.summarize(samples)
    result = {
        "us_per_call": summary["median"],
        "quartiles_us": summary["quartiles"],
        "calls": len(samples) * BATCH,
        "fallback_us_per_call": None if fallback_ns is None else fallback_ns / 1e3,
    }
    if args.raw:
        result["samples_us"] = samples  # us per call of each batch of BATCH calls
    harness.emit(result)
    return 0


def callgrind_child(args: argparse.Namespace) -> int:
    """Waits (uninstrumented) for the parent to switch callgrind on, runs the loop."""
    import torch

    torch.set_num_threads(1)
    device = "cpu"
    if args.side == "relay":
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target("cpu")
        torch_fallback.relay.set_home("cpu")
        device = "relay"
    a, b = torch.randn(1024, device=device), torch.randn(1024, device=device)
    add = torch.add
    for _ in range(200):
        add(a, b)
    callgrind_runner.ready(args.workdir)
    for _ in range(args.calls):
        add(a, b)
    callgrind_runner.done(args.workdir)
    return 0


def run_timing(side: str, args: argparse.Namespace) -> dict:
    argv = ["--timing-child", f"--device={args.device}", f"--calls={args.calls}"]
    return harness.run_side(__file__, side, argv + (["--raw"] if args.raw else []))


def run_callgrind(side: str, calls: int, workdir: Path) -> Path:
    argv = ["--callgrind-child", f"--side={side}", f"--calls={calls}"]
    return callgrind_runner.run(__file__, argv, workdir, side)


def component_costs(path: Path, calls: int) -> dict:
    total, _, edges = parse_callgrind(path)
    wrapping, wrapping_found = entered_cost(WRAPPING, edges)
    return {
        "total_ir_per_call": total / calls,
        "components": component_tree(total, edges, calls, COMPONENTS),
        "wrapping_adoption_ir_per_call": wrapping / calls,
        "wrapping_functions": wrapping_found,
    }


def render(result: dict) -> str:
    t = result["timing"]
    lines = [
        f"torch {result['meta']['torch']}, device {result['meta']['device']}, 1 CPU thread, "
        f"{result['meta']['date']}, source {result['meta'].get('source')}",
        "",
        f"1K-element add, median us per call over {t['native']['calls']} calls "
        f"(best of {t.get('rounds', 1)} runs per side)",
        f"  native {t['native']['us_per_call']:.2f}  relay {t['relay']['us_per_call']:.2f}  "
        f"overhead {t['relay']['us_per_call'] - t['native']['us_per_call']:+.2f} us; "
        f"inside the fallback (its metrics): {t['relay']['fallback_us_per_call']:.2f} us",
    ]
    cg = result.get("callgrind")
    if not cg:
        lines += ["", f"callgrind: {result.get('callgrind_note', 'not run')}"]
        return "\n".join(lines)
    native, relay = cg["native"], cg["relay"]
    by_key = {r["key"]: r for r in native["components"]}
    total = relay["total_ir_per_call"]
    # Ir to us at the relay loop's measured rate: a rough guide, not a measurement.
    us_per_ir = t["relay"]["us_per_call"] / total if result["meta"]["device"] == "cpu" else 0.0
    head = f"{'component':<62} {'incl':>6} {'excl':>6} {'share':>6} {'~us':>5} "
    head += f"{'native':>6} {'added':>6}"
    lines += [
        "",
        f"instructions (Ir) per call of the relay add, callgrind, {cg['calls']} calls. "
        "excl = incl minus the components nested in it;",
        "share = excl / relay total; ~us = excl at the relay loop's Ir rate; "
        "native = excl in the native loop; added = excl - native",
        head,
        "-" * len(head),
    ]
    for row in relay["components"]:
        n = by_key[row["key"]]["exclusive"]
        what = "  " * row["depth"] + row["what"]
        if not (row["functions"] or row["key"] == "python"):
            lines.append(f"{what:<62} {VISIBLE_NOTE}")
            continue
        lines.append(
            f"{what:<62} {row['inclusive']:>6.0f} {row['exclusive']:>6.0f} "
            f"{row['exclusive'] / total:>6.1%} {row['exclusive'] * us_per_ir:>5.2f} "
            f"{n:>6.0f} {row['exclusive'] - n:>+6.0f}"
        )
    wrapping = relay["wrapping_adoption_ir_per_call"]
    lines += [
        f"{'total':<62} {total:>6.0f} {'':>6} {'':>6} {total * us_per_ir:>5.2f} "
        f"{native['total_ir_per_call']:>6.0f} {total - native['total_ir_per_call']:>+6.0f}",
        f"cross-cutting, inclusive: wrapping/adoption (target views and their pool, adopt, "
        f"home_storage, storage release) {wrapping:.0f} Ir ({wrapping / total:.1%}, "
        f"~{wrapping * us_per_ir:.2f} us)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="timed calls per side")
    parser.add_argument("--rounds", type=int, default=3, help="timing runs per side, best kept")
    parser.add_argument("--callgrind-calls", type=int, default=2000)
    callgrind_runner.add_options(parser)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="target and home of the timing (callgrind is CPU only)")  # fmt: skip
    harness.add_output_options(parser)
    parser.add_argument("--from-json", help="only render the table of an earlier run")
    parser.add_argument("--side", choices=("native", "relay"), help=argparse.SUPPRESS)
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

    meta = {"device": args.device, **harness.host_info(torch)}
    result: dict = {"meta": meta}
    runs: dict[str, list[dict]] = {"native": [], "relay": []}
    for _ in range(args.rounds):  # alternating; the fastest round of each side is kept
        for side, results in runs.items():
            results.append(run_timing(side, args))
    best = {side: min(r, key=lambda x: x["us_per_call"]) for side, r in runs.items()}
    result["timing"] = {side: {k: v for k, v in row.items() if k != "samples_us"}
                        for side, row in best.items()}  # fmt: skip
    result["timing"]["rounds"] = args.rounds
    if args.raw:
        result["timing_rounds"] = runs
    missing = callgrind_runner.missing_tools()
    if args.no_callgrind:
        result["callgrind_note"] = "skipped (--no-callgrind)"
    elif missing:
        result["callgrind_note"] = (
            f"skipped: {', '.join(missing)} not found (apt-get install valgrind)"
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(args.keep or tmp)
            workdir.mkdir(parents=True, exist_ok=True)
            result["callgrind"] = {"calls": args.callgrind_calls}
            for side in ("native", "relay"):
                print(f"callgrind: {side} side, {args.callgrind_calls} calls", file=sys.stderr)
                path = run_callgrind(side, args.callgrind_calls, workdir)
                cost = component_costs(path, args.callgrind_calls)
                result["callgrind"][side] = cost
    harness.write_outputs(args, result, render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
