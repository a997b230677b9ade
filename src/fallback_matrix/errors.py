"""The exit codes of ``python -m fallback_matrix`` and every error it reports to the user.

Each error class stands for one kind of failure: its docstring says when it is raised, its
``exit_code`` what the command then exits with. The message is meant for the user as-is (the CLI
prints it without a traceback): what happened and what to do. The standard library only: a
cell's job imports this module where it runs, on an image's bare Python.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

EXIT_OK = 0  # every cell, test and check asked for passed
EXIT_FAILED = 1  # a cell, a test or a check failed
EXIT_USAGE = 2  # a wrong request: a bad matrix.yaml or option, an unknown cell (argparse's too)
EXIT_INTERRUPTED = 130  # Ctrl-C, or SIGTERM (a cancelled CI job): 128 + SIGINT, as shells say

# Why a cell's job ended with this exit status, where the status itself says so.
JOB_EXIT_REASONS = {
    137: ": killed by SIGKILL (docker kill, out of memory)",
    143: ": stopped by SIGTERM (docker stop)",
}


class MatrixError(Exception):
    """A wrong request, and the base of every error meant for the user: a bad option, an
    unknown cell, a missing wheel or result to work on, a release that would be rejected.
    Raised as such wherever no subclass says more; the CLI prints it and exits ``exit_code``."""

    exit_code = EXIT_USAGE


class Problem(NamedTuple):
    """One problem of a matrix file, located: its key path (``cells[1].torch``) and line."""

    key_path: str
    message: str
    line: int | None = None


class MatrixFileError(MatrixError):
    """matrix.yaml cannot be used (``matrix.load_matrix``): not found, not YAML, a repeated
    key, the schema, references between keys. Lists every problem with its file and line."""

    exit_code = EXIT_USAGE

    def __init__(self, file: Path, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        lines = [f"{file} is not a valid matrix ({len(problems)} problem(s)):"]
        for key, message, line in problems:
            at = f"{file}:{line}" if line else str(file)
            lines.append(f"  {at}:{f' {key}:' if key else ''} {message}")
        lines.append("Fix the file and run again; the comments at its top describe every key.")
        super().__init__("\n".join(lines))


class CapError(MatrixError):
    """A cache cap (--cache-cap, $FALLBACK_MATRIX_CACHE_CAP) that is not a size
    (``cache.parse_cap``); the message says how to write one."""

    exit_code = EXIT_USAGE


class DockerUnavailableError(MatrixError):
    """No Docker daemon answers where a command needs one (``runners.connect_docker``): a
    cell to run in a container (--runner docker, the default of reproduce, test-wheel, cross
    and publish-local); ``auto`` probes first and takes the local runner instead."""

    exit_code = EXIT_USAGE


class GpuUnavailableError(MatrixError):
    """Docker cannot give a cell's container the GPU it asks for (--gpus, a ``gpu: true``
    cell): this machine lacks a GPU or the NVIDIA Container Toolkit, so no cell there can."""

    exit_code = EXIT_USAGE


class CellError(MatrixError):
    """Preparing a cell failed (its wheelhouse, its image): ``running.run_cell`` records it as
    that cell's failure and the other cells go on."""

    exit_code = EXIT_FAILED


class StepFailed(MatrixError):
    """A step of a cell's job failed (``job``): the job records it in result.json and exits
    ``exit_code``; the host then reports the cell failed."""

    exit_code = EXIT_FAILED
