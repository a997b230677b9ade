"""How fast ops without a relay kernel run through the fallback, on a GPU host.

For each op and size, in one process, the median ms per call (and quartiles) after
warm-up, in six variants:
  native_cuda             native CUDA op on CUDA tensors
  fallback_cuda           relay tensors homed on CUDA, the op through the CUDA fallback
                          (target cuda, stream-ordered: the default)
  fallback_cuda_sync      as fallback_cuda, with a full device synchronize after each op
  fallback_cpu_cuda_home  relay tensors homed on CUDA, the op through the CPU fallback
                          (target cpu: the round trip the CUDA fallback replaces)
  fallback_cpu            relay tensors homed on the CPU, the op through the CPU fallback
  native_cpu              native CPU op on CPU tensors
and the ratios: cuda_fallback_ratio (fallback_cuda / native_cuda), cuda_fallback_extra_us
(fallback_cuda - native_cuda), cpu_fallback_ratio (fallback_cpu_cuda_home / fallback_cuda:
what the CUDA fallback saves) and sync_ratio (fallback_cuda_sync / fallback_cuda).

    python benchmarks/fallback_bench.py --json fallback.json --plot fallback.png

--json writes the summary (medians, quartiles, ratios, host and GPU); --raw adds every
call's time. --from-json renders an earlier summary again (the variants' earlier names,
a, b, b_sync, c, d and e, are read too).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass

import harness
import torch

import torch_fallback
import torch_fallback.relay

SIZES = {"1K": 1 << 10, "1M": 1 << 20, "16M": 1 << 24}
VARIANT_SETUP = {  # variant -> (tensor device, fallback target, relay home, cuda sync)
    "native_cuda": ("cuda", None, None, None),
    "fallback_cuda": ("relay", "cuda", "cuda", "stream"),
    "fallback_cuda_sync": ("relay", "cuda", "cuda", "device"),
    "fallback_cpu_cuda_home": ("relay", "cpu", "cuda", "stream"),
    "fallback_cpu": ("relay", "cpu", "cpu", "stream"),
    "native_cpu": ("cpu", None, None, None),
}
VARIANTS = tuple(VARIANT_SETUP)
# The variants' earlier names (results written before they were renamed).
EARLIER_NAMES = dict(zip(("a", "b", "b_sync", "c", "d", "e"), VARIANTS, strict=True))
RATIOS = {  # derived figure -> (numerator, denominator); the names say what they compare
    "cuda_fallback_ratio": ("fallback_cuda", "native_cuda"),
    "cpu_fallback_ratio": ("fallback_cpu_cuda_home", "fallback_cuda"),
    "sync_ratio": ("fallback_cuda_sync", "fallback_cuda"),
}
EARLIER_RATIOS = {"b_over_a": "cuda_fallback_ratio", "b_minus_a_us": "cuda_fallback_extra_us",
                  "c_over_b": "cpu_fallback_ratio", "b_sync_over_b": "sync_ratio"}  # fmt: skip


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


def measure(case: Case, variant: str, budget_s: float, max_repeats: int, raw: bool) -> dict:
    torch.manual_seed(0)
    inputs_cpu = case.make(SIZES[case.size])
    device = configure(variant)
    inputs = tuple(t.to(device) for t in inputs_cpu)
    torch.cuda.synchronize()
    torch_fallback.reset_metrics()
    timed = harness.time_calls(
        lambda: case.run(*inputs), torch.cuda.synchronize, budget_s, max_repeats=max_repeats
    )
    moved = sum(m.bytes_to_target + m.bytes_from_target for m in torch_fallback.metrics().values())
    calls = sum(m.calls for m in torch_fallback.metrics().values())
    return {
        "op": case.op,
        "size": case.size,
        "variant": variant,
        **timed.summary(raw),
        "fallback_calls": calls,
        "bytes_moved": moved,
    }


def ratios(rows: list[dict]) -> list[dict]:
    table = {(r["op"], r["size"], r["variant"]): r["median_ms"] for r in rows}
    out = []
    for op, size in dict.fromkeys((r["op"], r["size"]) for r in rows):
        ms = {v: table.get((op, size, v)) for v in VARIANTS}
        row = {"op": op, "size": size}
        for name, (numerator, denominator) in RATIOS.items():
            n, d = ms[numerator], ms[denominator]
            row[name] = n / d if n and d else None
        n, d = ms["fallback_cuda"], ms["native_cuda"]
        row["cuda_fallback_extra_us"] = (n - d) * 1e3 if n and d else None
        out.append(row)
    return out


def upgrade(document: dict) -> dict:
    """A summary written before the variants were renamed, with the current names."""
    for row in document["rows"]:
        row["variant"] = EARLIER_NAMES.get(row["variant"], row["variant"])
    for row in document.get("derived", []):
        for old, new in EARLIER_RATIOS.items():
            if old in row:
                row[new] = row.pop(old)
    return document


def render(rows: list[dict], derived: list[dict]) -> str:
    table = {(r["op"], r["size"], r["variant"]): r["median_ms"] for r in rows}
    widths = {v: max(len(v), 9) for v in VARIANTS}
    head = f"{'op':<20} {'size':>4} " + " ".join(f"{v:>{widths[v]}}" for v in VARIANTS)
    head += f" {'cuda/native':>11} {'+us':>6} {'cpu/cuda':>8}"
    lines = [
        "median ms per call; cuda/native: fallback_cuda / native_cuda, +us: fallback_cuda - "
        "native_cuda, cpu/cuda: fallback_cpu_cuda_home / fallback_cuda",
        head,
        "-" * len(head),
    ]
    for d in derived:
        cells = " ".join(
            f"{table[(d['op'], d['size'], v)]:>{widths[v]}.3f}"
            if (d["op"], d["size"], v) in table
            else f"{'-':>{widths[v]}}"
            for v in VARIANTS
        )
        fmt = lambda x, spec: format(x, spec) if x is not None else f"{'-':{spec[:-3]}}"  # noqa: E731
        lines.append(
            f"{d['op']:<20} {d['size']:>4} {cells} {fmt(d['cuda_fallback_ratio'], '>11.2f')} "
            f"{fmt(d['cuda_fallback_extra_us'], '>6.1f')} {fmt(d['cpu_fallback_ratio'], '>8.1f')}"
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
    axes[0].legend(title="variant", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_output_options(parser)
    parser.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    parser.add_argument("--from-json", help="only render the table/plot of an earlier run")
    parser.add_argument("--ops", nargs="*", help="only these ops")
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    parser.add_argument("--max-repeats", type=int, default=200)
    args = parser.parse_args(argv)

    if args.from_json:
        with open(args.from_json) as stream:
            rows = upgrade(json.load(stream))["rows"]
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
                rows.append(measure(case, variant, args.budget, args.max_repeats, args.raw))
                print(
                    f"{case.op:<20} {case.size:>4} {variant:<22} {rows[-1]['median_ms']:10.4f} ms",
                    flush=True,
                )
    derived = ratios(rows)
    document = None
    if not args.from_json:
        meta = {**harness.host_info(torch), "budget_s": args.budget}
        keys = ("device", "target", "home", "cuda_sync")
        meta["variants"] = {v: dict(zip(keys, s, strict=True)) for v, s in VARIANT_SETUP.items()}
        document = {"meta": meta, "rows": rows, "derived": derived}
    harness.write_outputs(args, document, render(rows, derived))
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
