"""Run a child process under callgrind with instrumentation on only around its measured loop.

The child sets up (uninstrumented), calls `ready()`, which waits for the parent's "go";
the parent switches instrumentation on with callgrind_control; the child runs its loop,
calls `done()` and waits until the parent has switched instrumentation off.
`event_totals` reads the totals of the output file (Ir, and the cache and branch
simulation's events when they were switched on); `event_totals_by_object` splits them
by the shared object whose code ran.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

CACHE_AND_BRANCHES = ("--cache-sim=yes", "--branch-sim=yes")


def add_options(parser: argparse.ArgumentParser) -> None:
    """--no-callgrind, --keep, and the child's own options (hidden)."""
    parser.add_argument("--no-callgrind", action="store_true")
    parser.add_argument("--keep", help="keep the callgrind output files in this folder")
    parser.add_argument("--callgrind-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)


def missing_tools() -> list[str]:
    return [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]


def run(script: str, argv: list[str], workdir: Path, label: str,
        valgrind_options: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Runs `script argv --workdir=workdir` under callgrind; the output file's path."""
    out = workdir / f"callgrind.{label}.out"
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--compress-strings=no",
               "--compress-pos=no", *valgrind_options, f"--callgrind-out-file={out}",
               sys.executable, script, *argv, f"--workdir={workdir}"]  # fmt: skip
    for marker in ("go", "done", "stop"):
        (workdir / marker).unlink(missing_ok=True)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("ready"):
        child.wait()
        raise RuntimeError(f"the callgrind child {label} failed before its loop: {line!r}")
    pid = line.split()[1]

    def instrumentation(state: str) -> None:
        subprocess.run(["callgrind_control", "-i", state, pid], check=True, capture_output=True)

    instrumentation("on")
    (workdir / "go").touch()
    while not (workdir / "done").exists():
        if child.poll() is not None:
            raise RuntimeError(f"the callgrind child {label} exited during its loop")
        time.sleep(0.05)
    instrumentation("off")
    (workdir / "stop").touch()
    child.wait()
    return out


def ready(workdir: str) -> None:
    """In the child: set up is done; returns when the parent has switched callgrind on."""
    print(f"ready {os.getpid()}", flush=True)
    while not (Path(workdir) / "go").exists():
        time.sleep(0.1)


def done(workdir: str) -> None:
    """In the child: the loop is over; returns when the parent has switched callgrind off."""
    (Path(workdir) / "done").touch()
    while not (Path(workdir) / "stop").exists():
        time.sleep(0.1)


def event_totals(path: Path) -> dict[str, int]:
    """{event: total} from the file's `events:` and `totals:` lines."""
    events: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            return dict(zip(events, map(int, line.split()[1:]), strict=True))
    raise ValueError(f"{path}: no totals line (did callgrind finish?)")


def event_totals_by_object(path: Path) -> dict[str, dict[str, int]]:
    """{shared object's path: {event: total}}: the cost of the code each object holds.
    The line after a `calls=` line is a call's inclusive cost, which its callee's own
    lines count already, so it is left out."""
    events: list[str] = []
    totals: dict[str, list[int]] = defaultdict(list)
    obj = "?"
    after_call = False
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("ob="):
            obj = line[3:].strip()
        elif line.startswith("calls="):
            after_call = True
        elif line[:1].isdigit() or line[:1] in "+-*":
            if after_call:
                after_call = False
                continue
            costs = totals[obj] or [0] * len(events)
            for index, value in enumerate(line.split()[1:]):
                costs[index] += int(value)
            totals[obj] = costs
    return {obj: dict(zip(events, costs, strict=True)) for obj, costs in totals.items()}
