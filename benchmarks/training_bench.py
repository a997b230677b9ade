"""Training steps, decoding, CUDA graphs, per-op overhead and the cross-home path:
relay against native, with an A/A control in the same run.

Measurements, medians after warm-up (training_workloads.py has the details):
  train       forward + backward + AdamW step of a CNN (4 conv+BN layers, batch 64,
              64x64) and a Transformer encoder (6 layers, d 512, batch 32, sequence
              128), float32 and bf16 under torch.autocast; --small shrinks both
  decode      greedy generate() with a KV cache of a small Llama and GPT-2 (4 layers
              x 256, random weights), batch 1, 64 new tokens: tokens/s, ids compared
  graph       replay of a CUDA graph of a forward (CUDA only)
  op          1K-element ops (add, mul, relu, sum, ...): latency (one call, then a
              synchronize) and throughput (100 calls, then one synchronize), in us
  cross_home  relay with home cpu and target cuda against the eager round trip
              (x.to("cuda"), op, .to("cpu")), fallback_bench's ops

Each side runs in its own process (this script with --side): the native side never
imports torch_fallback, whose registered PrivateUse1 device breaks native CUDA
autograd (pytorch/pytorch#161129). With --device cuda: relay CUDA target and home
against native CUDA (and relay CPU target and home against native CPU for the per-op
figures); with --device cpu: relay CPU target and home against native CPU.

    python benchmarks/training_bench.py --device cuda --json r.json --plot r.png
    python benchmarks/training_bench.py --device cpu --small --budget 1
    python benchmarks/training_bench.py --device cuda --only train decode graph --rounds 16

Within a round each relay measurement runs next to its native reference and a second
native process (the A/A control, which --no-control leaves out) measures the same
native reference; the order of the three rotates from round to round. Training steps,
decoding and graph replays are measured in --slices slices a round (of --budget/--slices
seconds each, at least one call; the order rotating from slice to slice): a shared
host's speed changes within a round, and pairs measured back to back cancel it. A
decoder is built and warmed up once per side, so that a slice times generate() alone.
--cpus pins every side to the same CPUs. --backward-on-calling-thread runs every side's
backward on the thread that calls it (torch.autograd.set_multithreading_enabled(False)):
the autograd engine runs relay's backward on a thread of its own, and on the CPU target
that thread's OpenMP team slows the main thread's (docs/relay.md, Performance).

Output: the table; --json the summary (meta with host and GPU, and per row the medians,
the ratio, the paired ratio and its quartiles, the A/A control's); --raw adds every
side's rows with each round's median; --from-json renders an earlier summary again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import harness

SIDES = ("native", "relay")
CONTROL = "control"  # the A/A control: a second native process, paired as relay is
KINDS = ("train", "decode", "graph", "op", "cross_home")
TIMED = ("train", "decode", "graph")  # kinds with a median time per round, paired
SLICED = ("train", "decode", "graph")  # kinds paired in --slices slices a round


def measure_all(args: argparse.Namespace, forwarded: list[str]) -> dict:
    """Every relay measurement next to its native reference and, unless --no-control,
    the same native measurement in a second native process (the A/A control), in an
    order that rotates from slice to slice: a cost of going first or last cancels out.
    Kinds of SLICED are measured in --slices slices a round, each one pairing the
    sides back to back."""
    names = [*SIDES] + ([] if args.no_control else [CONTROL])
    sides = {name: harness.SideProcess(__file__, name, forwarded) for name in names}
    plans = {name: sides[name].hello["plan"] for name in names}
    native_index = {(s["kind"], s["name"], s.get("dtype"), s["config"]): i
                    for i, s in enumerate(plans["native"])}  # fmt: skip
    pairs = [(native_index.get((s["kind"], s["name"], s.get("dtype"), s["ref"])), j)
             for j, s in enumerate(plans["relay"])]  # fmt: skip
    # Per side and row, its measurements: one per round, or one per slice.
    samples: dict[str, list[list[dict]]] = {name: [[] for _ in plans[name]] for name in names}
    for round_index in range(args.rounds):
        measured: set[tuple[str, int, int]] = set()  # a native row shared by relay rows: once
        for i, j in pairs:
            slices = args.slices if plans["relay"][j]["kind"] in SLICED else 1
            for slice_index in range(slices):
                for name in harness.rotated(names, round_index * slices + slice_index):
                    if name == "relay":
                        samples["relay"][j].append(sides["relay"].measure(j))
                    elif i is not None and (name, i, slice_index) not in measured:
                        measured.add((name, i, slice_index))
                        samples[name][i].append(sides[name].measure(i))
    for side in sides.values():
        side.close()
    return {name: {"meta": sides[name].hello["meta"],
                   "rows": [best_of(rows) for rows in samples[name] if rows]}
            for name in names}  # fmt: skip


def sliced_kinds(meta: dict) -> str:
    """The kinds a run measured in slices, in words; runs before decoding was sliced
    name none in their summary."""
    words = {"train": "training steps", "decode": "decoding", "graph": "graph replays"}
    kinds = [words[kind] for kind in meta.get("sliced", ["train", "graph"])]
    return ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]


def best_of(rows: list[dict]) -> dict:
    """A row's measurements merged: the fastest median of them (neighbours on a shared
    host only slow), and each one's median in round_ms, for pairing."""
    best = dict(rows[0])
    if "median_ms" in best:
        best["round_ms"] = [r["median_ms"] for r in rows]
    for key in ("median_ms", "latency_us", "throughput_us"):
        if key in best:
            best[key] = min(r[key] for r in rows)
    if "tokens_per_s" in best:  # the same tokens each round: at the kept median's speed
        tokens = rows[0]["tokens_per_s"] * rows[0]["median_ms"]
        best["tokens_per_s"] = tokens / best["median_ms"]
    best["repeats"] = sum(r["repeats"] for r in rows)
    best["rounds"] = len(rows)
    return best


def parse_cpus(text: str) -> set[int]:
    """Parses a CPU list: "2-5,8" is {2, 3, 4, 5, 8}."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            cpus.update(range(int(first), int(last or first) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--cpus {text!r}: expected a list like 2-5,8"
            ) from None
    return cpus


def side_main(args: argparse.Namespace) -> int:
    if args.cpus:  # before torch starts its threads, which inherit the mask
        os.sched_setaffinity(0, args.cpus)
    import torch
    import training_workloads as work

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.backward_on_calling_thread:
        torch.autograd.set_multithreading_enabled(False)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda needs a GPU: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    control = args.side == CONTROL
    plan = work.plan("native" if control else args.side, args.device)
    if control:  # each row compares with the same config on the native side
        plan = [{**spec, "ref": spec["config"]} for spec in plan]
    plan = [spec for spec in plan if spec["kind"] in args.only]
    meta = {
        "torch": str(torch.__version__),
        "threads": torch.get_num_threads(),
        "backward_thread": "calling" if args.backward_on_calling_thread else "engine's",
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "sizes": {"cnn": work.CNN[args.small], "transformer": work.TRANSFORMER[args.small]},
    }
    return harness.serve({"meta": meta}, plan, lambda spec: work.measure(spec, args))


def derive(native: list[dict], relay: list[dict]) -> dict[str, list[dict]]:
    """Pairs each relay (or control) row with its native reference."""
    ref = {(r["kind"], r["name"], r.get("dtype"), r["config"]): r for r in native}
    out: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    for r in relay:
        n = ref.get((r["kind"], r["name"], r.get("dtype"), r["ref"]))
        if n is None:
            continue
        if r["kind"] in TIMED:
            paired = harness.paired(r.get("round_ms", []), n.get("round_ms", []))
            spread = harness.summarize(paired) if paired else {"median": None, "quartiles": None}
            row = {
                "model": r["name"], "dtype": r.get("dtype"), "config": r["config"],
                "native_config": n["config"],
                "native_ms": n["median_ms"], "relay_ms": r["median_ms"],
                "ratio": r["median_ms"] / n["median_ms"],
                "paired_ratio": spread["median"], "paired_quartiles": spread["quartiles"],
                "fallback_calls_per_step": r.get("fallback_calls"),
                "boxed_calls_per_step": r.get("boxed_calls"),
            }  # fmt: skip
            if r["kind"] == "decode":
                row["native_tokens_per_s"] = n["tokens_per_s"]
                row["relay_tokens_per_s"] = r["tokens_per_s"]
                row["ids_equal"] = n["ids"] == r["ids"]
            out[r["kind"]].append(row)
        elif r["kind"] == "op":
            out["op"].append({
                "op": r["name"], "config": r["config"], "native_config": n["config"],
                "native_latency_us": n["latency_us"], "relay_latency_us": r["latency_us"],
                "latency_diff_us": r["latency_us"] - n["latency_us"],
                "native_throughput_us": n["throughput_us"],
                "relay_throughput_us": r["throughput_us"],
                "throughput_diff_us": r["throughput_us"] - n["throughput_us"],
            })  # fmt: skip
        else:
            out["cross_home"].append({
                "op": r["name"], "eager_round_trip_ms": n["median_ms"],
                "relay_ms": r["median_ms"], "ratio": r["median_ms"] / n["median_ms"],
            })  # fmt: skip
    return out


def add_control(derived: dict[str, list[dict]], control: dict[str, list[dict]]) -> None:
    """Gives each timed relay row the A/A control's paired ratio for its native reference."""
    for kind in TIMED:
        by_key = {(c["model"], c["dtype"], c["native_config"]): c for c in control[kind]}
        for row in derived[kind]:
            aa = by_key.get((row["model"], row["dtype"], row["native_config"]))
            row["control_paired_ratio"] = aa["paired_ratio"] if aa else None
            row["control_paired_quartiles"] = aa["paired_quartiles"] if aa else None


def calls_and_boxed(row: dict) -> str:
    """'calls (boxed)' of one step or generate(); older summaries have no boxed count."""
    calls, boxed = row.get("fallback_calls_per_step"), row.get("boxed_calls_per_step")
    if calls is None:
        return "-"
    return f"{calls}" + ("" if boxed is None else f" ({boxed})")


def timed_table(kind: str, rows: list[dict], meta: dict) -> list[str]:
    head = f"{'model':<12} {'dtype':<5} {'relay config':<15} {'native ms':>10} "
    head += f"{'relay ms':>10} {'ratio':>6} {'paired (quartiles)':>19} {'A/A (quartiles)':>19}"
    calls_head = f" {'calls (boxed)':>16}"  # per step, per generate()
    head += {"train": calls_head, "decode": f" {'tok/s':>8} {'ids':>6}" + calls_head}.get(kind, "")
    lines = [head]
    if kind == "train" and meta["device"] == "cpu":
        lines.insert(0, "(bf16: relay autocasts as CUDA does, native CPU by its own policy)")
    lines.append("-" * len(head))

    def paired(ratio: float | None, spread: list[float] | None) -> str:
        text = "-" if ratio is None else f"{ratio:.2f}"
        return text + (" ({:.2f}-{:.2f})".format(*spread) if spread else "")

    for d in rows:
        line = (
            f"{d['model']:<12} {d.get('dtype') or '-':<5} {d['config']:<15} "
            f"{d['native_ms']:>10.3f} {d['relay_ms']:>10.3f} {d['ratio']:>6.2f} "
            f"{paired(d.get('paired_ratio'), d.get('paired_quartiles')):>19} "
            f"{paired(d.get('control_paired_ratio'), d.get('control_paired_quartiles')):>19}"
        )
        if kind == "decode":
            same = "equal" if d["ids_equal"] else "DIFFER"
            line += f" {d['relay_tokens_per_s']:>8.1f} {same:>6}"
        if kind in ("train", "decode"):
            line += f" {calls_and_boxed(d):>16}"
        lines.append(line)
    return lines


def render(derived: dict[str, list[dict]], meta: dict) -> str:
    lines = [
        f"torch {meta['torch']}, device {meta['device']}"
        + (f" ({meta['gpu']})" if meta.get("gpu") else "")
        + f", {meta['threads']} CPU threads"
        + (", backward on the calling thread" if meta.get("backward_thread") == "calling" else "")
        + f", {'small' if meta['small'] else 'full'} sizes, "
        f"{meta['date']}, source {meta.get('source')}, best of {meta.get('rounds', 1)} round(s) "
        f"of {meta['budget_s']} s per measurement"
        + (
            f" ({sliced_kinds(meta)}: {meta['slices']} paired slices a round)"
            if meta.get("slices", 1) > 1
            else ""
        ),
        f"sizes: {json.dumps(meta['sizes'])}",
    ]
    if meta.get("control"):
        lines.append("A/A: a second native process measured beside relay, paired with native "
                     "the same way; its ratio is the host's own spread")  # fmt: skip
    if meta.get("cpu_model"):
        lines.append(f"host CPU: {meta['cpu_model']}")
    if meta.get("cpus"):
        lines.append(f"both sides pinned to CPUs {meta['cpus']}")
    titles = {
        "train": "training step (forward + backward + AdamW step)",
        "decode": "greedy decoding, batch 1, KV cache: one generate() call",
        "graph": "CUDA graph replay of a captured forward (8 Linear 256, batch 4)",
    }
    for kind in TIMED:
        if derived.get(kind):
            lines += [
                "",
                f"{titles[kind]}, median; ratio: of the best rounds, paired: median "
                "(and quartiles) of the rounds' (slices') relay/native, A/A: the control's",
                *timed_table(kind, derived[kind], meta),
            ]
    if derived["op"]:
        head = f"{'op':<11} {'relay config':<15} {'native':>7} {'relay':>7} {'+us':>6}   "
        head += f"{'native':>7} {'relay':>7} {'+us':>6}"
        lines += ["", "1K-element op, us per call: latency (call + sync) | throughput (in a loop)"]
        lines += [head, "-" * len(head)]
        for d in derived["op"]:
            lines.append(
                f"{d['op']:<11} {d['config']:<15} {d['native_latency_us']:>7.2f} "
                f"{d['relay_latency_us']:>7.2f} {d['latency_diff_us']:>+6.2f} | "
                f"{d['native_throughput_us']:>7.2f} {d['relay_throughput_us']:>7.2f} "
                f"{d['throughput_diff_us']:>+6.2f}"
            )
    if derived["cross_home"]:
        head = f"{'op':<24} {'eager round trip ms':>20} {'relay cuda/cpu ms':>18} {'ratio':>6}"
        lines += ["", "cross-home path: relay home cpu, target cuda, median", head]
        lines.append("-" * len(head))
        for d in derived["cross_home"]:
            lines.append(
                f"{d['op']:<24} {d['eager_round_trip_ms']:>20.3f} {d['relay_ms']:>18.3f} "
                f"{d['ratio']:>6.2f}"
            )
    return "\n".join(lines)


def plot(derived: dict[str, list[dict]], path: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("train", "op", "cross_home") if derived[k]]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, kind in zip(axes[0], panels, strict=True):
        rows = derived[kind]
        if kind == "op":
            labels = [f"{d['op']}\n{d['config'].split()[1]}" for d in rows]
            ax.bar(labels, [d["throughput_diff_us"] for d in rows], label="in a loop")
            ax.plot(labels, [d["latency_diff_us"] for d in rows], "o", color="k", label="+sync")
            ax.axhline(2.0, color="r", linestyle="--", label="goal: 2 us")
            ax.set_ylabel("relay - native, us per call")
            ax.set_title("1K-element op overhead")
        else:
            labels = (
                [f"{d['model']} {d['dtype']}" for d in rows] if kind == "train"
                else [d["op"] for d in rows]
            )  # fmt: skip
            goal = 1.05 if kind == "train" else 1.0
            ax.bar(labels, [d["ratio"] for d in rows])
            ax.axhline(goal, color="r", linestyle="--", label=f"goal: {goal}x")
            ax.set_ylabel("relay / native" if kind == "train" else "relay / eager round trip")
            ax.set_title("training step" if kind == "train" else "cross-home path")
            if kind == "cross_home":
                ax.set_yscale("log")
        ax.tick_params(axis="x", labelrotation=60, labelsize=8)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each measurement; best kept")
    parser.add_argument("--slices", type=int, default=4,
                        help="training steps and graph replays: paired measurements a round, "
                        "of --budget/--slices seconds each (default 4)")  # fmt: skip
    parser.add_argument("--small", action="store_true", help="small models (for CPU hosts)")
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS),
                        help="measure only these kinds")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--backward-on-calling-thread", action="store_true",
                        help="every side runs backward on the thread that calls it")  # fmt: skip
    harness.add_output_options(parser)
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--from-json", help="only render the table/plot of an earlier run")
    parser.add_argument("--no-control", action="store_true",
                        help="leave out the A/A control (a second native process measured "
                        "beside relay, the host's own spread between two processes)")  # fmt: skip
    parser.add_argument(
        "--cpus",
        type=parse_cpus,
        help="pin both sides to these CPUs, e.g. 2-5 (default: no pinning)",
    )
    parser.add_argument("--side", choices=(*SIDES, CONTROL), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.slices < 1:
        parser.error(f"--slices {args.slices}: a round needs at least one slice")
    if args.side:
        return side_main(args)

    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        forwarded = [f"--device={args.device}", f"--budget={args.budget}"]
        forwarded.append(f"--slices={args.slices}")
        forwarded += [f"--threads={args.threads}"] + (["--small"] if args.small else [])
        forwarded += ["--backward-on-calling-thread"] if args.backward_on_calling_thread else []
        forwarded += ["--only", *args.only]
        if args.cpus:
            forwarded.append("--cpus=" + ",".join(map(str, sorted(args.cpus))))
        sides = measure_all(args, forwarded)
        meta = {
            **sides["relay"]["meta"], "device": args.device, "small": args.small,
            "budget_s": args.budget, "rounds": args.rounds, "slices": args.slices,
            "sliced": list(SLICED), **harness.host_info(),
            "control": not args.no_control, "cpus": sorted(args.cpus) if args.cpus else None,
        }  # fmt: skip
        rows = {side: sides[side]["rows"] for side in sides}
        derived = derive(rows["native"], rows["relay"])
        if CONTROL in rows:
            add_control(derived, derive(rows["native"], rows[CONTROL]))
        data = {"meta": meta, "derived": derived}
        if args.raw:  # every side's rows, with each round's median
            data["rows"] = rows
    table = render(data["derived"], data["meta"])
    harness.write_outputs(args, None if args.from_json else data, table)
    if args.plot:
        plot(data["derived"], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
