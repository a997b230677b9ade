"""The summary: a row of build and test results per cell and per example, and a row of step
times per cell (the slowest step in bold), from artifacts/."""

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from rich.table import Table

from .job import STEPS
from .report import JUNIT_FILE, RESULT_FILE, format_elapsed

HEADERS = ["cell", "runner", "build", "passed", "failed", "skipped", "time", "result"]
NUMERIC = ("passed", "failed", "skipped", "time")
OTHER = "other"  # a cell's time outside its job's steps
STEP_NOTE = (
    f"{OTHER}: a cell's time outside its job's steps (wheelhouse, image, container start); "
    "each cell's slowest step in bold; a failed step marked !"
)


class JUnitCounts(NamedTuple):
    passed: int = 0
    failed: int = 0  # failures and errors
    skipped: int = 0


def read_counts(report: Path) -> JUnitCounts | None:
    """The counts of a pytest JUnit report; None when it is missing or unreadable."""
    try:
        suites = list(ET.parse(report).iter("testsuite"))  # the root, or those under it
    except (OSError, ET.ParseError):
        return None
    tests, failed, skipped = (
        sum(int(suite.get(key) or 0) for suite in suites for key in keys)
        for keys in (["tests"], ["failures", "errors"], ["skipped"])
    )
    return JUnitCounts(max(tests - failed - skipped, 0), failed, skipped)


class CellRow(NamedTuple):
    cell: str
    runner: str
    build: str
    tests: JUnitCounts | None
    result: str
    seconds: float | None


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def collect_rows(artifacts_root: Path, cells: Sequence[str] | None = None) -> list[CellRow]:
    """Rows for ``cells`` (default: every cell directory under ``artifacts_root``)."""
    if cells is None:
        cells = sorted(result.parent.name for result in artifacts_root.glob(f"*/{RESULT_FILE}"))
    rows = []
    for cell in cells:
        directory = artifacts_root / cell
        result = read_json(directory / RESULT_FILE)
        steps = {step.get("name"): step for step in result.get("steps", [])}
        runner = str(result.get("runner", "-"))
        tests = read_counts(directory / JUNIT_FILE)
        passed = result.get("exit_code", 0 if result.get("result") == "passed" else 1) == 0
        unreached = "not reached" if "failed_step" in result else "-"
        build = steps.get("build", {}).get("status", unreached)  # a step is "ok" or "failed"
        outcome = "passed" if passed else "FAILED"
        rows.append(CellRow(cell, runner, build, tests, outcome, result.get("seconds")))
        if steps:  # the job ran: the example has a row, reached or not
            example = steps.get("example", {"status": "not reached"})
            state, seconds = example["status"], example.get("seconds")
            tests = read_counts(directory / "example" / JUNIT_FILE)
            outcome = "passed" if state == "ok" else "FAILED"
            rows.append(CellRow(f"{cell}/example", runner, state, tests, outcome, seconds))
    return rows


def _cells(row: CellRow) -> list[str]:
    numbers = [str(n) for n in row.tests] if row.tests else ["-"] * 3
    time = format_elapsed(row.seconds) if row.seconds is not None else "-"
    return [row.cell, row.runner, row.build, *numbers, time, row.result]


def render_table(rows: Sequence[CellRow], title: str = "matrix") -> Table:
    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, justify="right" if header in NUMERIC else "left")
    for row in rows:
        table.add_row(*_cells(row), style="green" if row.result == "passed" else "red")
    return table


def render_markdown(rows: Sequence[CellRow], title: str = "matrix") -> str:
    lines = [f"### {title}", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        mark = ":white_check_mark: passed" if row.result == "passed" else ":x: FAILED"
        lines.append("| " + " | ".join([*_cells(row)[:-1], mark]) + " |")
    return "\n".join(lines) + "\n"


def closing_line(rows: Sequence[CellRow], label: str = "matrix") -> str:
    counts = [row.tests for row in rows if row.tests is not None]
    passed, failed, skipped = (sum(column) for column in zip(*counts, JUnitCounts(), strict=True))
    return f"{label}: {passed} passed, {failed} failed, {skipped} skipped"


class StepTimes(NamedTuple):
    """A cell's steps as its job recorded them: name -> (status, seconds); and its total time."""

    cell: str
    steps: dict[str, tuple[str, float | None]]
    seconds: float | None

    @property
    def other(self) -> float | None:
        """The time outside the steps, when every step's time is known."""
        times = [seconds for _, seconds in self.steps.values()]
        if self.seconds is None or None in times:
            return None
        return max(self.seconds - sum(t for t in times if t is not None), 0.0)

    @property
    def slowest(self) -> str | None:
        timed = {name: seconds for name, (_, seconds) in self.steps.items() if seconds is not None}
        return max(timed, key=lambda name: timed[name]) if timed else None


def collect_step_times(artifacts_root: Path, cells: Sequence[str] | None = None) -> list[StepTimes]:
    """The step times of ``cells`` (default: every cell under ``artifacts_root``) whose job
    recorded steps."""
    if cells is None:
        cells = sorted(result.parent.name for result in artifacts_root.glob(f"*/{RESULT_FILE}"))
    rows = []
    for cell in cells:
        result = read_json(artifacts_root / cell / RESULT_FILE)
        steps = {
            str(step["name"]): (str(step.get("status", "-")), step.get("seconds"))
            for step in result.get("steps", [])
            if isinstance(step, dict) and "name" in step
        }
        if steps:
            rows.append(StepTimes(cell, steps, result.get("seconds")))
    return rows


def step_names(rows: Sequence[StepTimes]) -> list[str]:
    """The steps any row has, in the job's order (unknown names after)."""
    names = dict.fromkeys(name for row in rows for name in row.steps)
    return [*(name for name in STEPS if name in names), *(n for n in names if n not in STEPS)]


def step_grid(rows: Sequence[StepTimes], bold: tuple[str, str]) -> list[list[str]]:
    """A line per step, then ``other`` and ``total``: the step's name and its time in each
    cell (a column per cell: the cells fit across, the steps run down)."""
    grid = []
    for name in step_names(rows):
        line = [name]
        for row in rows:
            status, seconds = row.steps.get(name, ("-", None))
            text = format_elapsed(seconds) if seconds is not None else "-"
            text += "!" if status == "failed" else ""
            line.append(f"{bold[0]}{text}{bold[1]}" if name == row.slowest else text)
        grid.append(line)
    for name, times in ((OTHER, [row.other for row in rows]), ("total", [r.seconds for r in rows])):
        grid.append([name, *(format_elapsed(t) if t is not None else "-" for t in times)])
    return grid


def render_step_table(rows: Sequence[StepTimes], title: str = "step times") -> Table:
    table = Table(title=title, caption=STEP_NOTE)
    table.add_column("step")
    for row in rows:
        table.add_column(row.cell, justify="right")
    last_step = step_names(rows)[-1]
    for line in step_grid(rows, ("[bold]", "[/bold]")):
        table.add_row(*line, end_section=line[0] == last_step)
    return table


def render_step_markdown(rows: Sequence[StepTimes], title: str = "step times") -> str:
    headers = ["step", *(row.cell for row in rows)]
    lines = [f"### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(line) + " |" for line in step_grid(rows, ("**", "**"))]
    return "\n".join([*lines, "", STEP_NOTE]) + "\n"
