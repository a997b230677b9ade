"""Training steps, per-op overhead and the cross-home path: relay against native.

Three measurements, medians after warm-up (training_workloads.py has the details):
  train       forward + backward + AdamW step of a CNN (4 conv+BN layers, batch 64,
              64x64) and a Transformer encoder (6 layers, d 512, batch 32, sequence
              128), float32 and bf16 under torch.autocast; --small shrinks both
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
    python benchmarks/training_bench.py --device cuda --only train --control  # A/A

Within a round each relay measurement runs next to its native reference, the two in
alternating order from round to round; --cpus pins both sides to the same CPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SIDES = ("native", "relay")
CONTROL = "control"  # a second native process in relay's place (--control)
KINDS = ("train", "op", "cross_home")


def source_version() -> str | None:
    """The checkout's commit (+dirty), or None outside a git checkout."""
    command = ["git", "describe", "--always", "--dirty"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parent)
    except OSError:
        return None
    return done.stdout.strip() or None


MARK = "@@row "  # prefixes the side's JSON lines on its stdout


class Side:
    """A side process that runs one measurement per request, so that the parent can
    interleave native and relay measurements (both then see the same host)."""

    def __init__(self, side: str, argv: list[str], runs_as: str | None = None) -> None:
        command = [sys.executable, __file__, *argv, "--side", runs_as or side]
        print(f"== {side} side: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        self.side = side
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.hello = self.read()

    def read(self) -> dict:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK) :])
        status = self.process.wait()
        raise SystemExit(f"the {self.side} side failed (exit status {status}); see above")

    def run(self, index: int) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def measure_all(args: argparse.Namespace, forwarded: list[str]) -> dict:
    second = CONTROL if args.control else "relay"
    sides = {"native": Side("native", forwarded), "relay": Side("relay", forwarded, second)}
    plans = {side: sides[side].hello["plan"] for side in SIDES}
    native_index = {(s["kind"], s["name"], s.get("dtype"), s["config"]): i
                    for i, s in enumerate(plans["native"])}  # fmt: skip
    pairs = [(native_index.get((s["kind"], s["name"], s.get("dtype"), s["ref"])), j)
             for j, s in enumerate(plans["relay"])]  # fmt: skip
    runs: dict[str, list[list[dict]]] = {side: [] for side in SIDES}
    for round_index in range(args.rounds):
        rows: dict[str, list] = {"native": [None] * len(plans["native"]),
                                 "relay": [None] * len(plans["relay"])}  # fmt: skip
        # Each relay measurement next to its native reference, which of the two goes
        # first alternating between rounds: a cost of going second cancels out.
        order = SIDES if round_index % 2 == 0 else SIDES[::-1]
        for i, j in pairs:
            for side in order:
                if side == "relay":
                    rows["relay"][j] = sides["relay"].run(j)
                elif i is not None:
                    rows["native"][i] = sides["native"].run(i)
        for side in SIDES:
            runs[side].append([row for row in rows[side] if row is not None])
    for side in sides.values():
        side.close()
    return {side: {"meta": sides[side].hello["meta"], "rows": best_of_rounds(runs[side])}
            for side in SIDES}  # fmt: skip


def best_of_rounds(rounds: list[list[dict]]) -> list[dict]:
    """Per row, the fastest median of the rounds (neighbours on a shared host only slow)."""
    merged = []
    for rows in zip(*rounds, strict=True):
        best = dict(rows[0])
        if "median_ms" in best:
            best["round_ms"] = [r["median_ms"] for r in rows]
        for key in ("median_ms", "latency_us", "throughput_us"):
            if key in best:
                best[key] = min(r[key] for r in rows)
        best["repeats"] = sum(r["repeats"] for r in rows)
        best["rounds"] = len(rows)
        merged.append(best)
    return merged


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
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "sizes": {"cnn": work.CNN[args.small], "transformer": work.TRANSFORMER[args.small]},
    }
    print(MARK + json.dumps({"meta": meta, "plan": plan}), flush=True)
    for line in sys.stdin:
        print(MARK + json.dumps(work.measure(plan[int(line)], args)), flush=True)
    return 0


def paired_ratios(native: dict, relay: dict) -> list[float]:
    """Each round's relay/native, the two measured back to back: a slowdown of the
    whole host during a round cancels out."""
    pairs = zip(native.get("round_ms", []), relay.get("round_ms", []), strict=True)
    return [r / n for n, r in pairs]


def quartiles(values: list[float]) -> tuple[float, float] | None:
    """The first and third quartiles, or None for fewer than two values."""
    if len(values) < 2:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def derive(native: list[dict], relay: list[dict]) -> dict[str, list[dict]]:
    """Pairs each relay row with its native reference."""
    ref = {(r["kind"], r["name"], r.get("dtype"), r["config"]): r for r in native}
    out: dict[str, list[dict]] = {"train": [], "op": [], "cross_home": []}
    for r in relay:
        n = ref.get((r["kind"], r["name"], r.get("dtype"), r["ref"]))
        if n is None:
            continue
        if r["kind"] == "train":
            paired = paired_ratios(n, r)
            out["train"].append({
                "model": r["name"], "dtype": r["dtype"], "config": r["config"],
                "native_ms": n["median_ms"], "relay_ms": r["median_ms"],
                "ratio": r["median_ms"] / n["median_ms"],
                "paired_ratio": statistics.median(paired) if paired else None,
                "paired_quartiles": quartiles(paired),
                "fallback_calls_per_step": r.get("fallback_calls"),
            })  # fmt: skip
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


def render(derived: dict[str, list[dict]], meta: dict) -> str:
    lines = [
        f"torch {meta['torch']}, device {meta['device']}"
        + (f" ({meta['gpu']})" if meta.get("gpu") else "")
        + f", {meta['threads']} CPU threads, {'small' if meta['small'] else 'full'} sizes, "
        f"{meta['date']}, source {meta.get('source')}, best of {meta.get('rounds', 1)} round(s) "
        f"of {meta['budget_s']} s per measurement",
        f"sizes: {json.dumps(meta['sizes'])}",
    ]
    if meta.get("control"):
        lines.append("control run (--control): the relay columns are a second native process")
    if meta.get("cpus"):
        lines.append(f"both sides pinned to CPUs {meta['cpus']}")
    if derived["train"]:
        head = f"{'model':<12} {'dtype':<5} {'relay config':<15} {'native ms':>10} "
        head += f"{'relay ms':>10} {'ratio':>6} {'paired (quartiles)':>19} "
        head += f"{'fallback calls/step':>20}"
        lines += ["", "training step (forward + backward + AdamW step), median; ratio: of the "
                  "best rounds, paired: median (and quartiles) of the rounds' relay/native",
                  head]  # fmt: skip
        if meta["device"] == "cpu":
            lines.insert(-1, "(bf16: relay autocasts as CUDA does, native CPU by its own policy)")
        lines.append("-" * len(head))
        for d in derived["train"]:
            calls = d["fallback_calls_per_step"]
            calls = "-" if calls is None else calls
            paired = "-" if d.get("paired_ratio") is None else f"{d['paired_ratio']:.2f}"
            if d.get("paired_quartiles"):
                paired += " ({:.2f}-{:.2f})".format(*d["paired_quartiles"])
            lines.append(
                f"{d['model']:<12} {d['dtype']:<5} {d['config']:<15} {d['native_ms']:>10.3f} "
                f"{d['relay_ms']:>10.3f} {d['ratio']:>6.2f} {paired:>19} {calls:>20}"
            )
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
    parser.add_argument("--small", action="store_true", help="small models (for CPU hosts)")
    parser.add_argument("--only", nargs="+", choices=KINDS, default=list(KINDS),
                        help="measure only these kinds")  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--table", help="write the table here as text")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--from-json", help="only render the table/plot of an earlier run")
    parser.add_argument("--control", action="store_true",
                        help="an A/A run: a second native process in relay's place, to see "
                        "the host's own spread between two processes")  # fmt: skip
    parser.add_argument(
        "--cpus",
        type=parse_cpus,
        help="pin both sides to these CPUs, e.g. 2-5 (default: no pinning)",
    )
    parser.add_argument("--side", choices=(*SIDES, CONTROL), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.side:
        return side_main(args)

    if args.from_json:
        data = json.loads(Path(args.from_json).read_text())
    else:
        forwarded = [f"--device={args.device}", f"--budget={args.budget}"]
        forwarded += [f"--threads={args.threads}"] + (["--small"] if args.small else [])
        forwarded += ["--only", *args.only]
        if args.cpus:
            forwarded.append("--cpus=" + ",".join(map(str, sorted(args.cpus))))
        sides = measure_all(args, forwarded)
        meta = {
            **sides["relay"]["meta"], "device": args.device, "small": args.small,
            "budget_s": args.budget, "rounds": args.rounds, "date": time.strftime("%Y-%m-%d"),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "source": source_version(), "control": args.control,
            "cpus": sorted(args.cpus) if args.cpus else None,
        }  # fmt: skip
        rows = {side: sides[side]["rows"] for side in SIDES}
        derived = derive(rows["native"], rows["relay"])
        data = {"meta": meta, "rows": rows, "derived": derived}
    table = render(data["derived"], data["meta"])
    print(table)
    if args.json and not args.from_json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    if args.table:
        Path(args.table).write_text(table + "\n")
    if args.plot:
        plot(data["derived"], args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
