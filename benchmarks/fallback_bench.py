"""How fast ops without a relay kernel run through the fallback, on a GPU host.

For each op and size, in one process, medians over repeated runs after warm-up:
  a  native CUDA op on CUDA tensors
  b  relay op, CUDA target, CUDA home (stream-ordered, the default)
  b_sync  as b, with a full device synchronize after each fallback op
  c  relay op, CPU target, CUDA home (the CPU fallback the CUDA one replaces)
  d  relay op, CPU target, CPU home
  e  native CPU op on CPU tensors

    python benchmarks/fallback_bench.py --json fallback.json --plot fallback.png
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import torch_fallback
import torch_fallback.relay

SIZES = {"1K": 1 << 10, "1M": 1 << 20, "16M": 1 << 24}
VARIANTS = ("a", "b", "b_sync", "c", "d", "e")
VARIANT_SETUP = {  # variant -> (tensor device, fallback target, relay home, cuda sync)
    "a": ("cuda", None, None, None),
    "b": ("relay", "cuda", "cuda", "stream"),
    "b_sync": ("relay", "cuda", "cuda", "device"),
    "c": ("relay", "cpu", "cuda", "stream"),
    "d": ("relay", "cpu", "cpu", "stream"),
    "e": ("cpu", None, None, None),
}


@dataclass(frozen=True)
class Case:
    op: str
    size: str
    make: Callable[[int], tuple]  # CPU inputs for n elements
    run: Callable[..., object]


def cases() -> list[Case]:
    def nonzero(n):
        return ((torch.rand(n) > 0.5).float(),)

    def unique(n):
        return (torch.randint(0, max(2, n // 10), (n,)),)

    def one_vector(n):
        return (torch.randn(n),)

    def repeat_interleave(n):
        return torch.randn(n), torch.randint(0, 3, (n,))

    def embedding_bag(n):
        bags = max(1, n // 16)
        return torch.randn(10_000, 64), torch.randint(0, 10_000, (n,)), torch.arange(bags) * 16

    def grid_sampler(n):
        shape = {1 << 10: (1, 1, 32, 32), 1 << 20: (4, 16, 128, 128), 1 << 24: (16, 16, 256, 256)}[
            n
        ]
        batch, _, height, width = shape
        return torch.randn(shape), torch.rand(batch, height, width, 2) * 2 - 1

    def scatter_reduce(n):
        return torch.zeros(max(1, n // 4)), torch.randint(0, max(1, n // 4), (n,)), torch.randn(n)

    def cdist(n):
        side = {1 << 10: 32, 1 << 20: 1024, 1 << 24: 4096}[n]
        return torch.randn(side, 64), torch.randn(side, 64)

    ops = {
        "nonzero": (nonzero, lambda x: torch.nonzero(x)),
        "unique": (unique, lambda x: torch.unique(x)),
        "repeat_interleave": (repeat_interleave, lambda x, r: torch.repeat_interleave(x, r)),
        "embedding_bag": (
            embedding_bag,
            lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o, mode="sum"),
        ),
        "grid_sampler_2d": (
            grid_sampler,
            lambda x, g: torch.nn.functional.grid_sample(x, g, align_corners=False),
        ),
        "scatter_reduce_mean": (
            scatter_reduce,
            lambda x, i, s: x.scatter_reduce(0, i, s, reduce="mean", include_self=True),
        ),
        "sort": (one_vector, lambda x: torch.sort(x)),
        "median": (one_vector, lambda x: torch.median(x)),
        "cdist": (cdist, lambda a, b: torch.cdist(a, b)),
    }
    return [Case(name, size, make, run) for name, (make, run) in ops.items() for size in SIZES]


def configure(variant: str) -> str:
    device, target, home, sync = VARIANT_SETUP[variant]
    if target is not None:
        torch_fallback.set_target(target)
        torch_fallback.relay.set_home(home)
        torch_fallback.set_cuda_sync(sync)
    return device


def time_op(fn: Callable[[], object], budget_s: float, max_repeats: int) -> tuple[float, int]:
    """Median ms of fn() with the GPU drained after each call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_repeats and (len(samples) < 5 or time.perf_counter() < deadline):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), len(samples)


def measure(case: Case, variant: str, budget_s: float, max_repeats: int) -> dict:
    torch.manual_seed(0)
    inputs_cpu = case.make(SIZES[case.size])
    device = configure(variant)
    inputs = tuple(t.to(device) for t in inputs_cpu)
    torch.cuda.synchronize()
    torch_fallback.reset_metrics()
    median_ms, repeats = time_op(lambda: case.run(*inputs), budget_s, max_repeats)
    moved = sum(m.bytes_to_target + m.bytes_from_target for m in torch_fallback.metrics().values())
    calls = sum(m.calls for m in torch_fallback.metrics().values())
    return {
        "op": case.op,
        "size": case.size,
        "variant": variant,
        "median_ms": median_ms,
        "repeats": repeats,
        "fallback_calls": calls,
        "bytes_moved": moved,
    }


def ratios(rows: list[dict]) -> list[dict]:
    table = {(r["op"], r["size"], r["variant"]): r["median_ms"] for r in rows}
    out = []
    for op, size in dict.fromkeys((r["op"], r["size"]) for r in rows):

        def get(variant: str, op: str = op, size: str = size) -> float | None:
            return table.get((op, size, variant))

        a, b, c = get("a"), get("b"), get("c")
        out.append(
            {
                "op": op,
                "size": size,
                "b_over_a": b / a if a and b else None,
                "b_minus_a_us": (b - a) * 1e3 if a and b else None,
                "c_over_b": c / b if b and c else None,
                "b_sync_over_b": get("b_sync") / b if b and get("b_sync") else None,
            }
        )
    return out


def render(rows: list[dict], derived: list[dict]) -> str:
    table = {(r["op"], r["size"], r["variant"]): r["median_ms"] for r in rows}
    head = f"{'op':<20} {'size':>4} " + " ".join(f"{v:>9}" for v in VARIANTS)
    head += f" {'b/a':>6} {'b-a us':>7} {'c/b':>7}"
    lines = ["median ms per call", head, "-" * len(head)]
    for d in derived:
        cells = " ".join(
            f"{table[(d['op'], d['size'], v)]:>9.3f}"
            if (d["op"], d["size"], v) in table
            else f"{'-':>9}"
            for v in VARIANTS
        )
        fmt = lambda x, spec: format(x, spec) if x is not None else "-"  # noqa: E731
        lines.append(
            f"{d['op']:<20} {d['size']:>4} {cells} {fmt(d['b_over_a'], '>6.2f')} "
            f"{fmt(d['b_minus_a_us'], '>7.1f')} {fmt(d['c_over_b'], '>7.1f')}"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, len(SIZES), figsize=(6 * len(SIZES), 6), sharey=False)
    for ax, size in zip(axes, SIZES, strict=True):
        width = 0.8 / len(VARIANTS)
        for k, variant in enumerate(VARIANTS):
            values = [
                next(
                    (
                        r["median_ms"]
                        for r in rows
                        if r["op"] == op and r["size"] == size and r["variant"] == variant
                    ),
                    float("nan"),
                )
                for op in ops
            ]
            ax.bar([i + k * width for i in range(len(ops))], values, width, label=variant)
        ax.set_yscale("log")
        ax.set_title(f"{size} elements")
        ax.set_xticks([i + 0.4 for i in range(len(ops))], ops, rotation=45, ha="right")
        ax.set_ylabel("median ms (log)")
    axes[0].legend(title="a native CUDA, b CUDA fallback, c/d CPU fallback, e CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--from-json", help="only render the table/plot of an earlier run")
    parser.add_argument("--ops", nargs="*", help="only these ops")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--max-repeats", type=int, default=200)
    args = parser.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as stream:
            rows = json.load(stream)["rows"]
    else:
        if not torch.cuda.is_available():
            print(
                "fallback_bench needs a CUDA GPU: torch.cuda.is_available() is False",
                file=sys.stderr,
            )
            return 2
        rows = []
        for case in cases():
            if args.ops and case.op not in args.ops:
                continue
            for variant in VARIANTS:
                rows.append(measure(case, variant, args.budget, args.max_repeats))
                print(
                    f"{case.op:<20} {case.size:>4} {variant:<7} {rows[-1]['median_ms']:10.4f} ms",
                    flush=True,
                )
    derived = ratios(rows)
    print(render(rows, derived))
    if args.json and not args.from_json:
        meta = {
            "date": time.strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0),
            "torch": str(torch.__version__),
        }
        with open(args.json, "w") as stream:
            json.dump({"meta": meta, "rows": rows, "derived": derived}, stream, indent=1)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
