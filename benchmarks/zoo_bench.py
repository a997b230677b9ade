"""The model zoo's speed: relay against native on the same device, with an A/A control.

For each zoo model (tests/models/zoo.py): inference in float32 and bfloat16 (one
forward, then a synchronize: what a user waiting for the result pays) and one
float32 training step (forward, backward, AdamW step, synchronize), in ms.

Three side processes answer one measurement per request: native (never imports
torch_fallback: pytorch/pytorch#161129), relay (CUDA target and home), and control
(a second native process in relay's place). Within a round each row is measured in
--slices short slices of --budget/--slices seconds; each slice measures every side
back to back, in an order that rotates from slice to slice, so a slower host during
a slice slows all sides. A row's figure is the median of its per-slice ratios over
all rounds, and the control's ratio is the noise floor of this host. Slices pair the
sides closer in time than whole rounds: on a shared host the speed changes within a
round, and one pair per round left ratios whose quartiles spanned 0.8 to 1.6.
--json writes the summary (medians, ratios and their quartiles, host and GPU); --raw
adds each slice's figures.

    python benchmarks/zoo_bench.py --device cuda --rounds 16 --json zoo.json
    python benchmarks/zoo_bench.py --device cuda --modes infer-fp32,infer-bf16 --rounds 16
    python benchmarks/zoo_bench.py --device cpu --models bert,gpt2 --rounds 4
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path

import harness

ZOO_FILE = Path(__file__).resolve().parents[1] / "tests" / "models" / "zoo.py"
SIDES = ("native", "relay", "control")
MODES = ("infer-fp32", "infer-bf16", "train-fp32")


def load_zoo():
    """tests/models/zoo.py by its path: it imports only torch and transformers."""
    spec = importlib.util.spec_from_file_location("zoo", ZOO_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["zoo"] = module
    spec.loader.exec_module(module)
    return module


def moved(inputs: dict, device: str, dtype) -> dict:
    """A zoo case's inputs on `device`, its floating-point tensors in `dtype`."""
    import torch

    def move(value):
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            return value.to(dtype) if value.is_floating_point() else value
        return value

    return {key: move(value) for key, value in inputs.items()}


def side_main(args: argparse.Namespace) -> int:
    import torch

    if args.backward_on_calling_thread:
        torch.autograd.set_multithreading_enabled(False)

    if args.side == "relay":
        import torch_fallback
        import torch_fallback.relay

        torch_fallback.set_target(args.device)
        torch_fallback.relay.set_home(args.device)
    device = "relay" if args.side == "relay" else args.device
    zoo = load_zoo()
    plan = [{"model": m, "mode": mode} for m in args.models for mode in args.modes]
    meta = {"side": args.side, "torch": torch.__version__}
    meta["backward_thread"] = "calling" if args.backward_on_calling_thread else "engine's"
    if args.device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(0)
    sync = torch.cuda.synchronize if args.device == "cuda" else harness.no_sync
    built: dict[tuple[str, str], tuple] = {}
    counted: set[tuple[str, str]] = set()  # rows whose fallback calls were counted

    def prepared(name: str, mode: str):
        dtype = torch.bfloat16 if mode == "infer-bf16" else torch.float32
        key = (name, mode)
        if key not in built:
            model, case = zoo.make_case(name, 1)
            model = model.to(device=device, dtype=dtype)
            inputs = case["batches"][0] if mode == "train-fp32" else case["eval"]
            inputs = moved(inputs, device, dtype)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            built[key] = (model, inputs, optimizer)
        return built[key]

    def step(model, inputs, optimizer, train: bool) -> None:
        if train:
            optimizer.zero_grad()
            model(**inputs).loss.backward()
            optimizer.step()
        else:
            with torch.no_grad():
                model(**inputs)

    def measure(row: dict) -> dict:
        model, inputs, optimizer = prepared(row["model"], row["mode"])
        train = row["mode"] == "train-fp32"
        model.train(train)

        def call(model=model, inputs=inputs, optimizer=optimizer, train=train) -> None:
            step(model, inputs, optimizer, train)

        # 3 warm-up calls (allocator, autotuning, lazy init, caches after another side
        # ran), then one slice's share of --budget
        budget = args.budget / args.slices
        timed = {**row, "ms": harness.time_calls(call, sync, budget, max_repeats=None).median}
        if args.side == "relay" and (row["model"], row["mode"]) not in counted:
            timed["fallback"] = harness.fallback_calls(call, sync)  # the same in every round: once
            counted.add((row["model"], row["mode"]))
        return timed

    return harness.serve({"meta": meta}, plan, measure)


def run(args: argparse.Namespace, forwarded: list[str]) -> dict:
    sides = {side: harness.SideProcess(__file__, side, forwarded) for side in SIDES}
    plan = sides["native"].hello["plan"]
    per_slice: dict[str, list[list[float]]] = {side: [] for side in SIDES}
    for round_index in range(args.rounds):
        for slice_index in range(args.slices):
            order = harness.rotated(SIDES, round_index * args.slices + slice_index)
            times: dict[str, list[float]] = {side: [0.0] * len(plan) for side in SIDES}
            for index in range(len(plan)):
                for side in order:
                    answer = sides[side].measure(index)
                    times[side][index] = answer["ms"]
                    if "fallback" in answer:
                        plan[index]["fallback"] = answer["fallback"]  # the first slice's
            for side in SIDES:
                per_slice[side].append(times[side])
        print(f"round {round_index + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for side in sides.values():
        side.close()
    rows = []
    for index, row in enumerate(plan):
        times = {side: [r[index] for r in per_slice[side]] for side in SIDES}
        ratio = {s: harness.summarize(harness.paired(times[s], times["native"])) for s in SIDES[1:]}
        rows.append(
            {
                **row,
                "native_ms": statistics.median(times["native"]),
                "relay_ms": statistics.median(times["relay"]),
                "relay_ratio": ratio["relay"]["median"],
                "relay_quartiles": ratio["relay"]["quartiles"],
                "control_ratio": ratio["control"]["median"],
                "control_quartiles": ratio["control"]["quartiles"],
            }
        )
    meta = {**sides["relay"].hello["meta"], "rounds": args.rounds, "slices": args.slices}
    meta["budget_s"] = args.budget
    meta |= harness.host_info()
    meta["command"] = " ".join(["python", "benchmarks/zoo_bench.py", *forwarded])
    result = {"meta": meta, "rows": rows}
    if args.raw:  # each slice's ms, per side, in plan order
        result["slices_ms"] = {"plan": plan, **per_slice}
    return result


def added_us_per_call(row: dict) -> float | None:
    """relay's added host time per fallback call: the paired excess over native
    times native's step time, over the step's fallback calls."""
    calls = (row.get("fallback") or {}).get("calls", 0)
    if not calls:
        return None
    return (row["relay_ratio"] - 1.0) * row["native_ms"] * 1000.0 / calls


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def render(result: dict) -> str:
    meta = result["meta"]
    lines = [
        f"zoo speed, relay/native (median of {meta['rounds']} rounds x "
        f"{meta.get('slices', 1)} paired slices; control = A/A)",
        f"host: {meta.get('cpu_model') or meta.get('cpu')}; {meta.get('gpu') or 'no GPU'}; "
        f"torch {meta['torch']}"
        + (", backward on the calling thread" if meta.get("backward_thread") == "calling" else ""),
        "",
        "| model | mode | native ms | relay ms | relay/native (quartiles) | control "
        "| fallback calls (boxed) | +µs per call |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    boxed_ops: dict[str, int] = {}
    for row in result["rows"]:
        q = row["relay_quartiles"]
        spread = f" ({q[0]:.2f}-{q[1]:.2f})" if q else ""
        calls = row.get("fallback") or {"calls": 0, "boxed": {}}
        for op, count in calls["boxed"].items():
            boxed_ops[op] = boxed_ops.get(op, 0) + count
        lines.append(
            f"| {row['model']} | {row['mode']} | {row['native_ms']:.2f} | {row['relay_ms']:.2f} "
            f"| {row['relay_ratio']:.2f}{spread} | {row['control_ratio']:.2f} "
            f"| {calls['calls']} ({sum(calls['boxed'].values())}) "
            f"| {_signed(added_us_per_call(row))} |"
        )
    if boxed_ops:
        ranked = sorted(boxed_ops.items(), key=lambda item: -item[1])
        lines += ["", "boxed calls, all rows: " + ", ".join(f"{op} {n}" for op, n in ranked)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (default: all three)",
    )
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument(
        "--budget",
        type=float,
        default=0.1,
        help="seconds per row, side and round, split over its slices",
    )
    parser.add_argument(
        "--slices", type=int, default=4, help="paired measurements per row and round (default 4)"
    )
    parser.add_argument("--backward-on-calling-thread", action="store_true",
                        help="every side runs backward on the thread that calls it "
                        "(on the CPU target, relay's backward thread slows the main thread's "
                        "OpenMP team: docs/relay.md)")  # fmt: skip
    harness.add_output_options(parser)
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.slices < 1:
        parser.error(f"--slices {args.slices}: a round needs at least one slice")
    args.modes = args.modes.split(",")
    unknown = [mode for mode in args.modes if mode not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; the modes are {', '.join(MODES)}")
    if not args.models:
        args.models = [entry.name for entry in load_zoo().ZOO]
        argv = [*argv, "--models", ",".join(args.models)]
    else:
        args.models = args.models.split(",")
    if args.side:
        return side_main(args)
    result = run(args, argv)
    harness.write_outputs(args, result, render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
