"""Strict OpInfo sweep: every op_db entry through relay, compared with eager.

Every entry of PyTorch's OpInfo database, in float32, float64, bfloat16, float16,
complex64, int64 and bool where the OpInfo supports the dtype on the reference device, up
to --samples samples each, in three phases: forward, float64 gradients (torch.autograd.grad
of a fixed random projection of the outputs) and the in-place variant. After every op the
outputs AND every tensor argument are compared with eager (a mismatch in an argument is a
hidden mutation the fallback lost), as are devices, dtypes, shapes, layouts and quantization.

Eager runs in reference worker processes that never import torch_fallback.relay, relay in
test worker processes; a crash or a timeout is recorded and the worker restarted.
--self-test runs the reference device in place of relay (every entry must pass); --perturb
perturbs the values read back from the device under test (the checker must fail).

The table goes to stdout (and --txt); --json writes the summary and every failed task,
with --raw every task.

    python -m torch_fallback.testing.sweep --target cpu --home cpu --json opinfo-cpu.json
    python -m torch_fallback.testing.sweep --self-test --ops add,sin --perturb
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import sys
import tempfile
import time

from . import report
from .pool import Pool, WorkerStartError
from .samples import DTYPES, PHASES
from .worker import Config


def _names(text: str, allowed=None) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [n for n in names if allowed is not None and n not in allowed]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown: {', '.join(unknown)}; choose from {', '.join(allowed)}"
        )
    return names


def parse(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--target",
        default="cpu",
        choices=["cpu", "cuda"],
        help="fallback target; eager runs there too (the reference device)",
    )
    parser.add_argument("--home", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--ops", type=_names, help="comma-separated OpInfo names (all if unset)")
    parser.add_argument("--dtypes", type=lambda t: _names(t, DTYPES), default=list(DTYPES))
    parser.add_argument("--phases", type=lambda t: _names(t, PHASES), default=list(PHASES))
    parser.add_argument("--samples", type=int, default=4, help="samples per task (at most)")
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="reference/test worker pairs (each pair uses up to two cores)",
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per task")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="run the reference device in place of relay: everything must pass",
    )
    parser.add_argument(
        "--perturb",
        nargs="?",
        const="all",
        choices=["all", "outputs", "arguments", "grads"],
        help="perturb the values read back from the device under test (all, or "
        "only outputs, arguments after the op, or gradients)",
    )
    parser.add_argument("--json", help="write the summary and every failed task here")
    parser.add_argument("--raw", action="store_true", help="put every task into --json too")
    parser.add_argument("--txt", help="write the table here")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return parser.parse_args(argv)


# What PyTorch's OpInfo database (torch.testing._internal) imports beyond torch itself.
OPINFO_NEEDS = ("expecttest", "numpy")


def missing_opinfo_needs() -> list[str]:
    return [name for name in OPINFO_NEEDS if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse(argv, prog)
    missing = missing_opinfo_needs()
    if missing:
        print(
            f"{prog or 'sweep'}: PyTorch's OpInfo database needs {', '.join(missing)}, "
            f"which this environment lacks: pip install {' '.join(missing)}",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("PYTHONHASHSEED", "0")  # same sample order in every worker
    config = Config(
        reference=args.target,
        target=args.target,
        home=args.home,
        samples=args.samples,
        self_test=args.self_test,
        perturb=args.perturb,
    )
    results: list[dict] = []
    start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="opinfo-sweep-") as tmpdir,
        Pool(config, max(1, args.jobs), args.timeout, tmpdir) as pool,
    ):
        try:
            tasks = pool.list_tasks(ops=args.ops, dtypes=args.dtypes, phases=args.phases)
        except WorkerStartError as error:
            print(f"{prog or 'sweep'}: {error}", file=sys.stderr)
            return 2
        names = {name for name, _, _ in tasks}
        unknown = [
            op
            for op in args.ops or ()
            if op not in names and not any(name.startswith(op + ".") for name in names)
        ]
        if unknown:
            print(
                f"not in op_db (or no selected dtype/phase): {', '.join(unknown)}", file=sys.stderr
            )
        if not tasks:
            print("no OpInfo entry matches --ops/--dtypes/--phases", file=sys.stderr)
            return 2
        info = pool.info()

        def on_result(task, result) -> None:
            entry, dtype, phase = task
            results.append({"entry": entry, "dtype": dtype, "phase": phase, **result})
            if result["status"] == "fail" and not args.quiet:
                print(
                    f"  FAIL {entry} {dtype} {phase}: {result['class']}/"
                    f"{result['category']}: {str(result.get('detail'))[:160]}",
                    file=sys.stderr,
                    flush=True,
                )
            if not args.quiet and len(results) % 200 == 0:
                fails = sum(r["status"] == "fail" for r in results)
                print(
                    f"[{len(results)}/{len(tasks)}] {fails} failed, "
                    f"{time.perf_counter() - start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

        pool.run(tasks, on_result)
    results.sort(
        key=lambda r: (r["entry"], list(DTYPES).index(r["dtype"]), PHASES.index(r["phase"]))
    )
    meta = {
        "target": args.target,
        "home": args.home,
        "reference": args.target,
        "self_test": args.self_test,
        "perturb": args.perturb,
        "samples": args.samples,
        "torch": info.get("torch"),
        "torch_fallback": info.get("torch_fallback"),
        "gpu": info.get("gpu"),
        "python": platform.python_version(),
        "dtypes": args.dtypes,
        "phases": args.phases,
        "seconds": round(time.perf_counter() - start, 1),
    }
    summary = report.summarize(results, meta)
    text = report.render(summary, results)
    print(text)
    if args.txt:
        with open(args.txt, "w") as stream:
            stream.write(text + "\n")
    if args.json:
        with open(args.json, "w") as stream:
            stream.write(report.dumps(report.document(summary, results, raw=args.raw)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
