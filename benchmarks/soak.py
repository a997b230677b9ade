"""Soak: many fallback calls of mixed ops, sampling host RSS and CUDA memory.

    python benchmarks/soak.py --calls 100000 --target cpu --home cpu --json soak-cpu.json
    python benchmarks/soak.py --calls 20000 --target cuda --home cuda --json soak-cuda.json

Prints a table of the samples and the growth between the first sample after
warm-up and the last; memory that keeps growing with the number of calls is a leak.
--json writes the growth, the samples and the host.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import harness
import torch

import torch_fallback
import torch_fallback.relay

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * PAGE / 1e6


def cuda_mb() -> float:
    return torch.cuda.memory_allocated() / 1e6 if torch.cuda.is_available() else 0.0


def step(x: torch.Tensor, out: torch.Tensor) -> None:
    """One round of mixed fallback ops: in-place, out=, lists, .item()."""
    torch.nonzero(x > 0)
    torch.unique(x)
    torch.sort(x)
    x.add_(1).sub_(1)
    torch.mul(x, 2, out=out)
    torch.cat([x, out])
    x.sum().item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--target", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--home", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--samples", type=int, default=10)
    harness.add_output_options(parser, raw=False)
    args = parser.parse_args(argv)

    torch_fallback.set_target(args.target)
    torch_fallback.relay.set_home(args.home)
    x = torch.randn(1024).to("relay")
    out = torch.empty(1024).to("relay")
    torch_fallback.reset_metrics()
    for _ in range(200):  # warm-up: allocator caches and lazy init settle
        step(x, out)
    calls_per_round = sum(m.calls for m in torch_fallback.metrics().values()) // 200
    torch_fallback.reset_metrics()

    rounds = -(-args.calls // calls_per_round)
    every = max(1, rounds // args.samples)
    samples = []
    start = time.perf_counter()
    for round_ in range(rounds + 1):
        if round_ % every == 0:
            samples.append(
                {
                    "calls": round_ * calls_per_round,
                    "rss_mb": round(rss_mb(), 2),
                    "cuda_mb": round(cuda_mb(), 2),
                }
            )
        if round_ < rounds:
            step(x, out)
    elapsed = time.perf_counter() - start
    calls = sum(m.calls for m in torch_fallback.metrics().values())
    result = {
        "target": args.target,
        "home": args.home,
        "torch": str(torch.__version__),
        "fallback_calls": calls,
        "seconds": round(elapsed, 1),
        "rss_growth_mb": round(samples[-1]["rss_mb"] - samples[0]["rss_mb"], 2),
        "cuda_growth_mb": round(samples[-1]["cuda_mb"] - samples[0]["cuda_mb"], 2),
        "samples": samples,
        **harness.host_info(torch),
    }
    lines = [f"{'calls':>8} {'RSS MB':>9} {'CUDA MB':>9}"]
    for sample in samples:
        lines.append(f"{sample['calls']:>8} {sample['rss_mb']:>9.2f} {sample['cuda_mb']:>9.2f}")
    lines.append(
        f"{calls} fallback calls in {elapsed:.1f} s, target={args.target} home={args.home}; "
        f"RSS growth {result['rss_growth_mb']} MB, CUDA growth {result['cuda_growth_mb']} MB"
    )
    harness.write_outputs(args, result, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
