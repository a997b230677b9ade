"""The summary: a row of build and test results per cell and per example, from artifacts/."""

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from rich.table import Table

from .report import JUNIT_FILE, RESULT_FILE, format_elapsed

HEADERS = ["cell", "runner", "build", "passed", "failed", "skipped", "time", "result"]
NUMERIC = ("passed", "failed", "skipped", "time")


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
