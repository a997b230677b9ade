"""A table of cells x build and test results, from the artifacts of a run.

Reads ``artifacts/<cell>/``: result.json (the job's steps and the host's record)
and junit.xml (pytest). The third-party example a cell builds and
tests against its wheel (step ``example``, results in ``<cell>/example/``) is a
row of its own, ``<cell>/example``. The same rows render as a rich table for
the terminal and as GitHub-flavoured markdown for $GITHUB_STEP_SUMMARY.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from .junit import JUnitCounts, read_counts
from .report import format_elapsed

RESULT_FILE = "result.json"
JUNIT_FILE = "junit.xml"
LOG_FILE = "cell.log"
EXAMPLE_DIR = "example"


@dataclass(frozen=True)
class CellRow:
    cell: str
    runner: str
    build: str
    tests: JUnitCounts | None
    result: str
    seconds: float | None
    log: str


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _build_state(status: dict[str, Any]) -> str:
    for step in status.get("steps", []):
        if step.get("name") == "build":
            return "ok" if step.get("status") == "ok" else "failed"
    if status.get("failed_step"):
        return "not reached"
    return "-"


def read_row(cell_dir: Path) -> CellRow:
    result = status = read_json(cell_dir / RESULT_FILE)
    passed = result.get("exit_code", 0 if result.get("result") == "passed" else 1) == 0
    return CellRow(
        cell=cell_dir.name,
        runner=str(result.get("runner", "-")),
        build=_build_state(status),
        tests=read_counts(cell_dir / JUNIT_FILE),
        result="passed" if passed else "FAILED",
        seconds=result.get("seconds"),
        log=str(cell_dir / LOG_FILE),
    )


def example_row(cell_dir: Path, cell: CellRow) -> CellRow | None:
    """The row of the example step of a cell whose job ran (it recorded steps), else None."""
    status = read_json(cell_dir / RESULT_FILE)
    if "steps" not in status:
        return None
    step: dict[str, Any] = next(
        (s for s in status.get("steps", []) if s.get("name") == "example"), {}
    )
    state = {"ok": "ok", "failed": "failed"}.get(str(step.get("status")), "not reached")
    return CellRow(
        cell=f"{cell.cell}/{EXAMPLE_DIR}",
        runner=cell.runner,
        build=state,
        tests=read_counts(cell_dir / EXAMPLE_DIR / JUNIT_FILE),
        result="passed" if state == "ok" else "FAILED",
        seconds=step.get("seconds"),
        log=cell.log,
    )


def collect_rows(artifacts_root: Path, cells: Sequence[str] | None = None) -> list[CellRow]:
    """Rows for ``cells`` (default: every cell directory under ``artifacts_root``)."""
    if cells is None:
        cells = sorted(p.name for p in artifacts_root.glob("*") if (p / RESULT_FILE).is_file())
    rows = []
    for cell in cells:
        row = read_row(artifacts_root / cell)
        rows.append(row)
        example = example_row(artifacts_root / cell, row)
        if example is not None:
            rows.append(example)
    return rows


def total_counts(rows: Sequence[CellRow]) -> JUnitCounts:
    total = JUnitCounts()
    for row in rows:
        if row.tests is not None:
            total += row.tests
    return total


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _cells(row: CellRow) -> list[str]:
    tests = row.tests
    return [
        row.cell,
        row.runner,
        row.build,
        _count(None if tests is None else tests.passed),
        _count(None if tests is None else tests.failed + tests.errors),
        _count(None if tests is None else tests.skipped),
        format_elapsed(row.seconds) if row.seconds is not None else "-",
        row.result,
    ]


HEADERS = ["cell", "runner", "build", "passed", "failed", "skipped", "time", "result"]


def render_table(rows: Sequence[CellRow], title: str = "matrix") -> Table:
    table = Table(title=title)
    for header in HEADERS:
        table.add_column(
            header, justify="right" if header in ("passed", "failed", "skipped", "time") else "left"
        )
    for row in rows:
        style = "green" if row.result == "passed" else "red"
        table.add_row(*_cells(row), style=style)
    return table


def render_markdown(rows: Sequence[CellRow], title: str = "matrix") -> str:
    lines = [f"### {title}", "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = _cells(row)
        cells[-1] = ":white_check_mark: passed" if row.result == "passed" else ":x: FAILED"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def closing_line(rows: Sequence[CellRow], label: str = "matrix") -> str:
    """One plain line: '<label>: N passed, N failed, N skipped'."""
    total = total_counts(rows)
    failed = total.failed + total.errors
    return f"{label}: {total.passed} passed, {failed} failed, {total.skipped} skipped"
