"""Progress lines and subprocesses, for the host and a cell's job: the standard library only
(a job runs on an image's bare Python), rich only in ``Reporter.table``."""

import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import DEVNULL, PIPE, STDOUT, Popen
from typing import IO, Any

RESULT_FILE = "result.json"  # artifacts/<cell>/result.json: the job's steps and the host's record
JUNIT_FILE = "junit.xml"
LOG_FILE = "cell.log"


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


@dataclass
class Reporter:
    """Lines stamped with the time since the start (and the cell), copied to the cell's log
    when it has one; ``steps`` records the job's steps."""

    stream: IO[str] = field(default_factory=lambda: sys.stdout)
    cell: str = ""
    path: Path | None = None  # the cell's log
    started: float = field(default_factory=time.monotonic)
    steps: list[dict[str, Any]] = field(default_factory=list)
    file: IO[str] | None = None

    @contextmanager
    def for_cell(self, cell: str, path: Path) -> Iterator["Reporter"]:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as file:
            yield Reporter(self.stream, cell, path, self.started, file=file)

    def elapsed(self) -> str:
        return format_elapsed(time.monotonic() - self.started)

    def line(self, text: str) -> None:
        """A line as it is: a subprocess's or a container's output."""
        print(text, file=self.stream, flush=True)
        if self.file is not None:
            self.file.write(text + "\n")
            self.file.flush()

    def say(self, message: str) -> None:
        self.line(f"[+{self.elapsed()}] {self.cell + ' ' if self.cell else ''}{message}")

    def error(self, message: str) -> None:
        self.line(f"error: {message}")

    def rule(self, title: str) -> None:
        self.line(f"\n{'=' * 12} {title} {'=' * 12}")

    def table(self, renderable: Any) -> None:
        from rich.console import Console

        Console(file=self.stream, highlight=False, soft_wrap=True, width=120).print(renderable)

    @contextmanager
    def step(self, name: str, of: Sequence[str]) -> Iterator[None]:
        """A step of a job (number N of ``of``): announced, timed and recorded (``steps``)."""
        number = f"{of.index(name) + 1}/{len(of)}"
        self.line(f"\n==> [{self.cell}] step {number}: {name}  (+{self.elapsed()})")
        record: dict[str, Any] = {"name": name, "status": "failed"}  # until it ends well
        began = time.monotonic()
        self.steps.append(record)
        try:
            yield
            record["status"] = "ok"
        finally:
            record["seconds"] = round(time.monotonic() - began, 1)
        self.line(f"<== [{self.cell}] {name}: ok in {record['seconds']:.1f}s")


def without_pip_config(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with no pip configuration but its CA bundle: no other PIP_* variable, no config
    file read (``pip --isolated`` would still read a site-wide find-links folder or constraint)."""
    env = {key: value for key, value in environ.items() if key == "PIP_CERT" or key[:4] != "PIP_"}
    return env | {"PIP_CONFIG_FILE": os.devnull}


def run_process(command: Sequence[str | Path], sink: Callable[[str], None], **popen: Any) -> int:
    """Run ``command``, stderr merged into stdout, each line to ``sink``; its exit status."""
    with Popen(
        command, stdout=PIPE, stderr=STDOUT, stdin=DEVNULL, text=True, errors="replace", **popen
    ) as process:
        assert process.stdout is not None
        try:
            for text in process.stdout:
                sink(text.rstrip("\n"))
        except BaseException:
            process.terminate()
            raise
        return process.wait()
