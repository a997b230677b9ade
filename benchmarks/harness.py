"""What the benchmark scripts share: timing, side processes, host facts and their output.

Timing
    time_calls() warms fn up, then takes samples (per_sample calls, then sync()) until
    its time budget has passed; Timing has the median, the quartiles and the samples.
    summarize() gives the same figures for any list of values, paired() the per-round
    ratios of two sides measured back to back, rotated() the order of the sides in a
    round (so that a cost of going first or last cancels out).

Side processes
    A benchmark that compares native with relay runs each side in its own process: the
    script itself again, with ``--side NAME``. The native side never imports
    torch_fallback: relay's registered PrivateUse1 device breaks native CUDA autograd
    (pytorch/pytorch#161129). SideProcess keeps a side alive and asks it for
    one measurement at a time (serve() is the side's half); run_side() runs a side to
    its end and returns the last row it emitted. On the relay side, fallback_calls()
    counts one more step's fallback calls and the boxed ones among them.

Output
    host_info() (date, Python, CPU, source version), add_output_options() (--json,
    --table, --raw) and write_outputs(): the table on stdout (and in --table), the
    summary in --json. The summary holds what a reader needs (medians, quartiles,
    ratios, host and GPU); raw samples go into it only with --raw. dumps() writes JSON
    with small lists and objects on one line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Timing.


def quartiles(values: Sequence[float]) -> tuple[float, float] | None:
    """The first and third quartiles, or None for fewer than two values."""
    if len(values) < 2:
        return None
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """{"median", "quartiles": [q1, q3] (None for fewer than two values)} of values."""
    spread = quartiles(values)
    return {"median": statistics.median(values), "quartiles": list(spread) if spread else None}


@dataclass
class Timing:
    """The samples time_calls() took, in ms per call."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def repeats(self) -> int:
        return len(self.samples)

    def summary(self, raw: bool = False) -> dict[str, Any]:
        """{"median_ms", "q1_ms", "q3_ms", "repeats"}, and with raw "samples_ms"."""
        q1, q3 = quartiles(self.samples) or (None, None)
        out = {"median_ms": self.median, "q1_ms": q1, "q3_ms": q3, "repeats": self.repeats}
        return out | ({"samples_ms": self.samples} if raw else {})


def no_sync() -> None:
    """sync() for work that is done when the call returns (the CPU)."""


def time_calls(
    fn: Callable[[], object],
    sync: Callable[[], None] = no_sync,
    budget_s: float = 1.0,
    *,
    warmup: int = 3,
    min_repeats: int = 5,
    max_repeats: int | None = 1000,
    per_sample: int = 1,
) -> Timing:
    """Times fn(): `warmup` calls, then samples of `per_sample` calls followed by one
    sync(), in ms per call, until budget_s has passed and there are min_repeats samples
    (at most max_repeats; None: no limit)."""
    for _ in range(warmup):
        fn()
    sync()
    samples: list[float] = []
    limit = sys.maxsize if max_repeats is None else max_repeats
    deadline = time.perf_counter() + budget_s
    while len(samples) < limit and (len(samples) < min_repeats or time.perf_counter() < deadline):
        start = time.perf_counter()
        for _ in range(per_sample):
            fn()
        sync()
        samples.append((time.perf_counter() - start) * 1e3 / per_sample)
    return Timing(samples)


def paired(values: Sequence[float], references: Sequence[float]) -> list[float]:
    """Each round's value/reference, the two measured back to back in that round: a
    slowdown of the whole host during a round cancels out."""
    return [v / r for v, r in zip(values, references, strict=True)]


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """The order of the sides in a round: shifted by one from round to round."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


# Side processes: this script again, with --side NAME.

MARK = "@@row "  # prefixes a side's JSON lines on its stdout


def emit(row: dict) -> None:
    """A side's answer to its parent (one JSON line on stdout)."""
    print(MARK + json.dumps(row), flush=True)


def read_rows(lines: Iterable[str]) -> Iterator[dict]:
    """The rows a side emitted, from its stdout's lines."""
    for line in lines:
        if line.startswith(MARK):
            yield json.loads(line[len(MARK) :])


def serve(hello: dict, plan: list[dict], measure: Callable[[dict], dict]) -> int:
    """A side's main loop: hello (with the plan) first, then for each index its parent
    writes on stdin, measure(plan[index])."""
    emit({**hello, "plan": plan})
    for line in sys.stdin:
        emit(measure(plan[int(line)]))
    return 0


def side_command(script: str, side: str, argv: Sequence[str]) -> list[str]:
    return [sys.executable, script, *argv, "--side", side]


class SideProcess:
    """`script --side NAME`, alive for the whole run, one measurement per request: the
    parent interleaves the sides' measurements, so that all of them see the same host."""

    def __init__(self, script: str, side: str, argv: Sequence[str]) -> None:
        command = side_command(script, side, argv)
        print(f"== {side} side: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        self.side = side
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.hello = self.read()

    def read(self) -> dict:
        assert self.process.stdout is not None
        for row in read_rows(self.process.stdout):
            return row
        status = self.process.wait()
        raise SystemExit(f"the {self.side} side failed (exit status {status}); see above")

    def measure(self, index: int) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{index}\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait()


def run_side(script: str, side: str, argv: Sequence[str]) -> dict:
    """Runs `script --side NAME` to its end; the last row it emitted."""
    done = subprocess.run(side_command(script, side, argv), stdout=subprocess.PIPE, text=True)
    rows = list(read_rows(done.stdout.splitlines()))
    if done.returncode or not rows:
        raise SystemExit(f"the {side} side failed (exit status {done.returncode}); see above")
    return rows[-1]


def fallback_calls(call: Callable[[], object], sync: Callable[[], None] = no_sync) -> dict:
    """The fallback calls of one more call of `call` (a step, a generate()): how many, and
    the boxed ones by op (the unboxed kernels serve the others; a boxed call costs more
    host time). For a side that imported torch_fallback."""
    import torch_fallback
    from torch_fallback.testing.calls import boxed_calls

    torch_fallback.reset_metrics()
    call()
    sync()
    calls = sum(m.calls for m in torch_fallback.metrics().values())
    return {"calls": calls, "boxed": boxed_calls()}


# Host facts.


def source_version() -> str | None:
    """The checkout's commit (+dirty), or None outside a git checkout."""
    command = ["git", "describe", "--always", "--dirty"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).parent)
    except OSError:
        return None
    return done.stdout.strip() or None


def cpu_model() -> str | None:
    """The host CPU's model name (Linux), which decides how much host time shows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def host_info(torch: Any = None) -> dict[str, Any]:
    """Date, Python, CPU and source version; with the torch module, its version and the
    GPU's name (None without one)."""
    info: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "python": sys.version.split()[0],
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "source": source_version(),
    }
    if torch is not None:
        info["torch"] = str(torch.__version__)
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


# Output.


def add_output_options(parser: argparse.ArgumentParser, raw: bool = True) -> None:
    parser.add_argument("--json", help="write the summary here (medians, quartiles, ratios, host)")
    parser.add_argument("--table", help="write the table here as text")
    if raw:
        parser.add_argument(
            "--raw", action="store_true", help="put the raw samples into --json too"
        )


def dumps(value: Any, width: int = 100) -> str:
    """JSON, indented by one, where a list or object that fits in `width` columns stays
    on one line, and so does a row (an object in a list without objects or long lists in
    it); a long list of numbers fills its lines."""

    def is_row(value: Any) -> bool:
        return isinstance(value, dict) and not any(
            isinstance(v, dict) or (isinstance(v, list) and len(json.dumps(v)) > 40)
            for v in value.values()
        )

    def render(value: Any, indent: int, used: int, in_list: bool = False) -> str:
        flat = json.dumps(value, default=str)
        if (
            not isinstance(value, (dict, list))
            or not value
            or indent + used + len(flat) <= width
            or (in_list and is_row(value))
        ):
            return flat
        pad = " " * (indent + 1)
        if isinstance(value, dict):
            items = []
            for key, item in value.items():
                head = f"{json.dumps(str(key))}: "
                items.append(pad + head + render(item, indent + 1, len(head)))
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        if all(isinstance(item, (int, float)) for item in value):  # samples: fill the lines
            lines: list[list[str]] = [[]]
            for text in (json.dumps(item) for item in value):
                if lines[-1] and len(pad) + len(", ".join([*lines[-1], text])) + 1 > width:
                    lines.append([])
                lines[-1].append(text)
            body = ",\n".join(pad + ", ".join(line) for line in lines)
            return "[\n" + body + "\n" + " " * indent + "]"
        items = [pad + render(item, indent + 1, 0, in_list=True) for item in value]
        return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"

    return render(value, 0, 0) + "\n"


def write_outputs(args: argparse.Namespace, document: dict | None, table: str) -> None:
    """The table on stdout and in --table, the document in --json (None: none to write)."""
    print(table)
    if getattr(args, "table", None):
        Path(args.table).write_text(table + "\n")
    if document is not None and getattr(args, "json", None):
        Path(args.json).write_text(dumps(document))
