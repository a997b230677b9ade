"""Run a subprocess and hand each line of its output to a sink as it comes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LineSink = Callable[[str], None]


def run_streaming(
    command: Sequence[str],
    sink: LineSink,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> int:
    """Run ``command`` with stderr merged into stdout; return its exit status."""
    with subprocess.Popen(
        list(command),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env) if env is not None else None,
        cwd=cwd,
        text=True,
        errors="replace",
        bufsize=1,
    ) as process:
        assert process.stdout is not None
        try:
            for line in process.stdout:
                sink(line.rstrip("\n"))
        except BaseException:
            process.terminate()
            raise
        return process.wait()
