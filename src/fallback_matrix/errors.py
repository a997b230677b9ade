"""Errors a user of fallback_matrix can hit.

Each one carries a message that says what went wrong and what to do next; the
CLI prints that message and exits non-zero, never a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class MatrixError(Exception):
    """Base class: an error whose message is meant for the user as-is."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong in the matrix file, located by key path (and line, when known)."""

    key_path: str
    message: str
    line: int | None = None

    def render(self, file: Path) -> str:
        where = f"{file}:{self.line}" if self.line is not None else str(file)
        key = f" {self.key_path}:" if self.key_path else ""
        return f"{where}:{key} {self.message}"


class MatrixFileError(MatrixError):
    """The matrix file cannot be read or does not describe a valid matrix."""

    def __init__(self, file: Path, problems: Sequence[Problem]) -> None:
        self.file = file
        self.problems = tuple(problems)
        lines = [f"{file} is not a valid matrix ({len(self.problems)} problem(s)):"]
        lines += [f"  {problem.render(file)}" for problem in self.problems]
        lines.append("Fix the file and run again; the comments at its top describe every key.")
        super().__init__("\n".join(lines))


class UnknownCellError(MatrixError):
    def __init__(self, names: Sequence[str], known: Sequence[str]) -> None:
        self.names = tuple(names)
        super().__init__(
            f"unknown cell(s): {', '.join(names)}. Cells in matrix.yaml: {', '.join(known)} "
            "(python -m fallback_matrix list shows them)."
        )


class ProjectFileError(MatrixError):
    """pyproject.toml is missing or lacks what the matrix needs from it."""


class RunnerUnavailableError(MatrixError):
    """The requested runner cannot run on this machine."""


class WheelhouseError(MatrixError):
    """Filling a cell's wheelhouse failed."""


class ImageBuildError(MatrixError):
    """The build image of a cell could not be built."""
