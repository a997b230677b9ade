"""Progress output: which cell, which step, how long since the run started."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from rich.console import Console
from rich.markup import escape


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


NON_TTY_WIDTH = 120


def make_console() -> Console:
    """A console; CI logs (no terminal) get 120 columns rather than 80."""
    interactive = sys.stdout.isatty() or "COLUMNS" in os.environ
    return Console(highlight=False, soft_wrap=True, width=None if interactive else NON_TTY_WIDTH)


class Reporter:
    """Writes progress lines to the terminal, each stamped with the time since the start."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or make_console()
        self.started = time.monotonic()

    def elapsed(self) -> str:
        return format_elapsed(time.monotonic() - self.started)

    def step(self, cell: str, message: str) -> None:
        self.console.print(
            f"[dim]\\[+{self.elapsed()}][/dim] [bold cyan]{escape(cell)}[/] {escape(message)}"
        )

    def note(self, message: str) -> None:
        self.console.print(f"[dim]\\[+{self.elapsed()}][/dim] {escape(message)}")

    def warn(self, message: str) -> None:
        self.console.print(
            f"[dim]\\[+{self.elapsed()}][/dim] [yellow]warning:[/] {escape(message)}"
        )

    def error(self, message: str) -> None:
        self.console.print(f"[bold red]error:[/] {escape(message)}")

    def rule(self, title: str) -> None:
        self.console.rule(escape(title))

    def line(self, text: str) -> None:
        """A line of a subprocess's or container's output, printed as it is."""
        self.console.out(text, highlight=False)


class CellLog:
    """The log of one cell: every line goes to the terminal and to ``path``."""

    def __init__(self, reporter: Reporter, cell: str, path: Path) -> None:
        self.reporter = reporter
        self.cell = cell
        self.path = path
        self._file: IO[str] | None = None

    def __enter__(self) -> CellLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("w", encoding="utf-8")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _write(self, text: str) -> None:
        if self._file is not None:
            self._file.write(text + "\n")
            self._file.flush()

    def line(self, text: str) -> None:
        self.reporter.line(text)
        self._write(text)

    def step(self, message: str) -> None:
        self.reporter.step(self.cell, message)
        self._write(f"[+{self.reporter.elapsed()}] {self.cell} {message}")

    def warn(self, message: str) -> None:
        self.reporter.warn(f"{self.cell}: {message}")
        self._write(f"warning: {message}")
