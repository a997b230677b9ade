"""Run a cell's job on the host, with a host Python of the cell's version."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import RunnerUnavailableError
from ..report import Reporter
from ..report import run as run_streaming
from .base import CellWork, RunnerName, RunOutcome

VERSION_PROBE = "import sys; print('%d.%d' % sys.version_info[:2])"


def _python_version(executable: str) -> str | None:
    try:
        result = subprocess.run(
            [executable, "-c", VERSION_PROBE], capture_output=True, text=True, check=False
        )
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def find_python(
    version: str,
    which: Callable[[str], str | None] = shutil.which,
    purpose: str = "the local runner needs it for this cell; or use --runner docker",
) -> str:
    """An interpreter of ``version`` ("3.11"): this one, pythonX.Y on PATH, or pyenv's."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running == version:
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    installed = sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)
    for candidate in [which(f"python{version}"), *map(str, installed)]:
        if candidate and _python_version(candidate) == version:
            return candidate
    raise RunnerUnavailableError(
        f"no Python {version} here (this is Python {running}; none on PATH as python{version} "
        f"or under {pyenv}): install Python {version} ({purpose})"
    )


class LocalRunner:
    """The job with a host Python; its venvs, build dir and ccache under <cache>/local/."""

    name: RunnerName = "local"

    def run(self, work: CellWork, log: Reporter) -> RunOutcome:
        python = find_python(work.cell.python)
        root = work.cache_root / "local"
        job_dir = root / "work" / work.cell.name
        if job_dir.exists():
            shutil.rmtree(job_dir)
        job_dir.mkdir(parents=True)
        job = work.job(
            repo=str(work.repo),
            wheelhouse=str(work.wheelhouse),
            cache=str(root),
            work=str(job_dir),
            artifacts=str(work.artifacts),
        )
        job_file = job_dir / "job.json"
        job_file.write_text(job.to_json(), encoding="utf-8")
        if work.gpus:
            log.warn(
                "--gpus has no effect with the local runner: "
                "the job sees the host's GPUs as they are"
            )
        source = work.repo / "src"  # where `python -m` finds fallback_matrix.cell_job
        log.say(f"runner local: {python} -m fallback_matrix.cell_job in {source} (cache {root})")
        command = [python, "-m", "fallback_matrix.cell_job", str(job_file)]
        status = run_streaming(command, log.line, cwd=source)
        return RunOutcome(exit_code=status, where=f"local Python {python}")
