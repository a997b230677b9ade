"""Sweep PyTorch's OpInfo database through relay and compare with CPU eager.

For every OpInfo entry with float32 samples, up to --samples sample inputs run
on CPU eager and on relay tensors (so through torch-fallback's boxed fallback
with the chosen target and home); each entry passes, fails with a reason
category, or is unsupported. Writes JSON and prints a readable table.

    python benchmarks/opinfo_sweep.py --target cpu --home cpu --json opinfo-cpu.json
    python benchmarks/opinfo_sweep.py --target cuda --home cuda --json opinfo-cuda.json
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import time
import warnings
from dataclasses import asdict, dataclass

import torch
from torch.utils._pytree import tree_flatten, tree_map

import torch_fallback

# Reason categories, most specific first: (category, test on the error message).
CATEGORIES = [
    ("view", lambda m: "returns a view of its input" in m),
    ("sparse", lambda m: "sparse" in m.lower()),
    ("no-cuda-kernel", lambda m: "has no CUDA kernel" in m),
    # Python-level CUDA-only ops (jiterator) that build a CUDA guard for their input's device.
    ("cuda-only-python-op", lambda m: "CUDAGuardImpl initialized with non-CUDA" in m),
    ("mixed-devices", lambda m: "together with relay tensors" in m or "same device" in m),
    ("no-relay-kernel", lambda m: "Could not run" in m and ("PrivateUse1" in m or "relay" in m)),
    ("storage-or-data-ptr", lambda m: "data_ptr" in m or "storage" in m.lower()),
    # The op takes this argument on the CPU only; the sweep moved every tensor.
    ("cpu-only-argument", lambda m: "to be on cpu" in m),
    ("dtype-not-implemented", lambda m: "not implemented for" in m),
    ("numerics", lambda m: m.startswith("mismatch:")),
]


@dataclass
class EntryResult:
    op: str
    status: str  # "pass" | "fail" | "unsupported"
    category: str | None
    detail: str | None
    samples: int


def to_relay(value):
    return value.to("relay") if isinstance(value, torch.Tensor) else value


def clone(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


def to_cpu(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


def run(op, sample, transform, seed: int):
    torch.manual_seed(seed)
    args = tree_map(transform, (sample.input, *sample.args))
    kwargs = tree_map(transform, dict(sample.kwargs))
    return op(*args, **kwargs)


def compare(actual, expected, rtol, atol) -> None:
    flat_actual, _ = tree_flatten(tree_map(to_cpu, actual))
    flat_expected, _ = tree_flatten(expected)
    if len(flat_actual) != len(flat_expected):
        raise AssertionError(f"mismatch: {len(flat_actual)} outputs, expected {len(flat_expected)}")
    for a, e in zip(flat_actual, flat_expected, strict=True):
        if isinstance(e, torch.Tensor):
            try:
                torch.testing.assert_close(
                    a,
                    e,
                    rtol=rtol,
                    atol=atol,
                    equal_nan=True,
                    check_device=False,
                    check_stride=False,
                )
            except AssertionError as error:
                raise AssertionError("mismatch: " + str(error).splitlines()[0]) from None
        elif a != e and not (isinstance(e, float) and e != e):
            raise AssertionError(f"mismatch: {a!r} != {e!r}")


def categorize(error: BaseException) -> str:
    message = str(error)
    for name, matches in CATEGORIES:
        if matches(message):
            return name
    return f"error:{type(error).__name__}"


def is_random(op, sample) -> bool:
    try:
        first, second = run(op, sample, clone, 0), run(op, sample, clone, 1)
        compare(first, second, rtol=0, atol=0)
        return False
    except AssertionError:
        return True


def sweep_entry(op, max_samples: int, rtol: float, atol: float, reference: str) -> EntryResult:
    name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
    if op.name.split(".")[-1].startswith(("empty", "new_empty")):
        return EntryResult(name, "unsupported", "uninitialized-memory", None, 0)
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:max_samples]
    except Exception as error:
        return EntryResult(name, "unsupported", "no-samples", str(error)[:200], 0)
    if not samples:
        return EntryResult(name, "unsupported", "no-samples", None, 0)
    for sample in samples:
        try:
            expected = tree_map(to_cpu, run(op, sample, lambda v: clone(v).to(reference), 0))
        except Exception:
            continue
        try:
            compare(run(op, sample, to_relay, 0), expected, rtol, atol)
        except Exception as error:
            if str(error).startswith("mismatch") and is_random(op, sample):
                return EntryResult(name, "unsupported", "rng", str(error)[:200], len(samples))
            first_line = (str(error).strip().splitlines() or [""])[0]
            return EntryResult(name, "fail", categorize(error), first_line[:300], len(samples))
    return EntryResult(name, "pass", None, None, len(samples))


def render_table(summary: dict, results: list[EntryResult]) -> str:
    lines = [
        f"OpInfo sweep: target={summary['target']} home={summary['home']} "
        f"reference={summary['reference']} eager, torch={summary['torch']}",
        f"entries with float32 samples: {summary['entries']}  passed: {summary['passed']}  "
        f"failed: {summary['failed']}  unsupported: {summary['unsupported']}  "
        f"pass rate: {summary['pass_rate']:.1%}",
        "",
        f"{'status':<12} {'category':<28} {'entries':>7}",
        f"{'-' * 12} {'-' * 28} {'-' * 7}",
    ]
    for (status, category), count in sorted(summary["by_category"].items()):
        lines.append(f"{status:<12} {category:<28} {count:>7}")
    failures = [r for r in results if r.status == "fail"]
    if failures:
        lines += ["", "failures:"]
        lines += [f"  {r.op:<40} {r.category:<24} {r.detail or ''}"[:200] for r in failures]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--home", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--samples", type=int, default=3, help="samples per entry")
    parser.add_argument(
        "--reference",
        choices=["cpu", "cuda"],
        help="eager device to compare with (default: the target's, so CUDA results are "
        "compared with CUDA eager, same kernels and same random generator)",
    )
    parser.add_argument("--ops", nargs="*", help="only these OpInfo names")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    torch_fallback.set_target(args.target)
    torch_fallback.set_relay_home(args.home)
    reference = args.reference or ("cpu" if args.target == "cpu" else "cuda")
    rtol, atol = (1.3e-6, 1e-5) if reference == "cpu" else (1e-4, 1e-4)

    entries = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    if args.ops:
        entries = [op for op in entries if op.name in args.ops]
    start = time.perf_counter()
    # CPU eager is the reference: keep CUDA matmuls and convolutions in full fp32.
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        results = [sweep_entry(op, args.samples, rtol, atol, reference) for op in entries]
    results = [r for r in results if r.category != "no-samples"]

    counts = collections.Counter(r.status for r in results)
    by_category = collections.Counter((r.status, r.category or "-") for r in results)
    summary = {
        "target": args.target,
        "home": args.home,
        "reference": reference,
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.device_count() else None,
        "entries": len(results),
        "passed": counts["pass"],
        "failed": counts["fail"],
        "unsupported": counts["unsupported"],
        "pass_rate": counts["pass"] / max(1, len(results)),
        "seconds": round(time.perf_counter() - start, 1),
        "by_category": {f"{s}/{c}": n for (s, c), n in sorted(by_category.items())},
    }
    print(render_table({**summary, "by_category": by_category}, results))
    print(f"\n{summary['seconds']} s")
    if args.json:
        with open(args.json, "w") as stream:
            json.dump(
                {"summary": summary, "results": [asdict(r) for r in results]}, stream, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
