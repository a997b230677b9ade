"""The summary reads artifacts/<cell>/ and renders a terminal table and GitHub markdown."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from fallback_matrix import cli
from fallback_matrix.errors import EXIT_FAILED
from fallback_matrix.summary import (
    JUnitCounts,
    closing_line,
    collect_rows,
    collect_step_times,
    read_counts,
    render_markdown,
    render_step_markdown,
    render_step_table,
    render_table,
)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites name="pytest tests">
  <testsuite name="cpu" errors="{errors}" failures="{failures}" skipped="{skipped}"
             tests="{tests}" time="1.2">
    <testcase classname="tests.extension.test_x" name="test_a" time="0.1"/>
  </testsuite>
</testsuites>
"""


def write_cell(
    root: Path,
    name: str,
    *,
    tests: int,
    failures: int = 0,
    errors: int = 0,
    skipped: int = 0,
    exit_code: int = 0,
    build: str = "ok",
    example: str | None = None,
) -> None:
    cell = root / name
    cell.mkdir(parents=True)
    (cell / "junit.xml").write_text(
        JUNIT.format(tests=tests, failures=failures, errors=errors, skipped=skipped)
    )
    steps = [{"name": "environment", "status": "ok"}, {"name": "build", "status": build}]
    if example is not None:
        steps.append({"name": "example", "status": example, "seconds": 12.0})
        (cell / "example").mkdir()
        (cell / "example" / "junit.xml").write_text(
            JUNIT.format(tests=3, failures=int(example == "failed"), errors=0, skipped=0)
        )
    record = {"cell": name, "steps": steps, "runner": "docker", "exit_code": exit_code}
    (cell / "result.json").write_text(json.dumps({**record, "seconds": 75.0}))


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    write_cell(tmp_path, "cpu", tests=10, skipped=2, example="ok")
    write_cell(tmp_path, "cuda", tests=10, failures=1, errors=1, skipped=3, exit_code=1)
    return tmp_path


def test_junit_counts(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT.format(tests=7, failures=1, errors=1, skipped=2))
    assert read_counts(report) == JUnitCounts(
        passed=3, failed=2, skipped=2
    )  # errors count as failed


def test_junit_with_a_bare_testsuite_root(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text('<testsuite tests="3" failures="0" errors="0" skipped="1"/>')
    assert read_counts(report) == JUnitCounts(passed=2, skipped=1)


def test_missing_or_broken_junit_gives_none(tmp_path: Path) -> None:
    assert read_counts(tmp_path / "absent.xml") is None
    (tmp_path / "bad.xml").write_text("<testsuite")
    assert read_counts(tmp_path / "bad.xml") is None


def test_rows_from_artifacts(artifacts: Path) -> None:
    cpu, cpu_example, cuda, cuda_example = collect_rows(artifacts)
    assert (cpu.cell, cpu.runner, cpu.build, cpu.result) == ("cpu", "docker", "ok", "passed")
    assert cpu.tests == JUnitCounts(passed=8, skipped=2)
    assert cuda.result == "FAILED"
    assert cuda.tests == JUnitCounts(passed=5, failed=2, skipped=3)
    # the third-party example is a row of its own, also when the cell never reached it
    assert (cpu_example.cell, cpu_example.build, cpu_example.result) == (
        "cpu/example",
        "ok",
        "passed",
    )
    assert cpu_example.tests == JUnitCounts(passed=3) and cpu_example.seconds == 12.0
    assert (cuda_example.cell, cuda_example.build, cuda_example.result) == (
        "cuda/example",
        "not reached",
        "FAILED",
    )


def test_a_failed_example_fails_its_row_only(tmp_path: Path) -> None:
    write_cell(tmp_path, "cpu", tests=4, example="failed", exit_code=1)
    cpu, example = collect_rows(tmp_path)
    assert cpu.tests == JUnitCounts(passed=4)
    assert (example.build, example.result) == ("failed", "FAILED")
    assert example.tests == JUnitCounts(passed=2, failed=1)


def test_a_cell_that_never_built(tmp_path: Path) -> None:
    cell = tmp_path / "cpu"
    cell.mkdir()
    (cell / "result.json").write_text(
        json.dumps({"cell": "cpu", "runner": "docker", "exit_code": 1})
    )
    (row,) = collect_rows(tmp_path)
    assert (row.build, row.tests, row.result) == ("-", None, "FAILED")


def test_markdown_table(artifacts: Path) -> None:
    markdown = render_markdown(collect_rows(artifacts))
    lines = markdown.splitlines()
    assert lines[2] == "| cell | runner | build | passed | failed | skipped | time | result |"
    assert lines[3].startswith("|---|")
    assert "| cpu | docker | ok | 8 | 0 | 2 | 01:15 | :white_check_mark: passed |" in lines
    assert "| cuda | docker | ok | 5 | 2 | 3 | 01:15 | :x: FAILED |" in lines


def test_terminal_table(artifacts: Path) -> None:
    console = Console(file=io.StringIO(), width=120)
    console.print(render_table(collect_rows(artifacts)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "cpu" in text and "FAILED" in text and "passed" in text


def test_closing_line_adds_up_every_cell(artifacts: Path) -> None:
    assert closing_line(collect_rows(artifacts)) == "matrix: 16 passed, 2 failed, 5 skipped"


def test_summary_command_writes_github_markdown(
    artifacts: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    record = json.loads((artifacts / "cuda" / "result.json").read_text())
    record["error"] = "cell cuda failed in a container (exit status 1); log: cuda/cell.log"
    (artifacts / "cuda" / "result.json").write_text(json.dumps(record))
    status = cli.main(["summary", "--artifacts", str(artifacts)])
    assert status == EXIT_FAILED  # the cuda cell failed
    assert "| cuda | docker |" in step_summary.read_text()
    output = capsys.readouterr().out
    assert "matrix: 16 passed, 2 failed, 5 skipped" in output
    assert "error: cell cuda failed in a container (exit status 1)" in output  # why it failed


# --- step times ----------------------------------------------------------------------------------


def write_steps(root: Path, name: str, steps: list[tuple[str, str, float]], seconds: float) -> None:
    cell = root / name
    cell.mkdir(parents=True)
    record = [{"name": step, "status": status, "seconds": time} for step, status, time in steps]
    (cell / "result.json").write_text(
        json.dumps({"cell": name, "steps": record, "runner": "docker", "seconds": seconds})
    )


@pytest.fixture
def timed(tmp_path: Path) -> Path:
    write_steps(
        tmp_path,
        "cpu",
        [("environment", "ok", 42.0), ("build", "ok", 211.0), ("tests", "ok", 388.0)],
        seconds=700.0,
    )
    write_steps(
        tmp_path,
        "cross-cuda-213-on-cpu",
        [("environment", "ok", 610.0), ("install", "ok", 4.0), ("tests", "failed", 90.0)],
        seconds=720.0,
    )
    (tmp_path / "tooling").mkdir()  # a row without steps has no column
    (tmp_path / "tooling" / "result.json").write_text('{"cell": "tooling", "exit_code": 0}')
    return tmp_path


def test_step_times_per_cell_with_the_time_outside_the_job(timed: Path) -> None:
    cpu, cross = collect_step_times(timed)
    assert cpu.cell == "cpu" and cpu.steps["build"] == ("ok", 211.0)
    assert cpu.other == 59.0 and cpu.slowest == "tests"
    assert cross.slowest == "environment" and cross.other == 16.0


def test_step_times_markdown_shows_each_cells_slowest_step(timed: Path) -> None:
    markdown = render_step_markdown(collect_step_times(timed), title="matrix: step times")
    lines = markdown.splitlines()
    assert lines[0] == "### matrix: step times"
    assert lines[2] == "| step | cpu | cross-cuda-213-on-cpu |"
    # the job's order; a step a cell never ran is "-"; a failed one is marked
    assert lines[4:10] == [
        "| environment | 00:42 | **10:10** |",
        "| build | 03:31 | - |",
        "| install | - | 00:04 |",
        "| tests | **06:28** | 01:30! |",
        "| other | 00:59 | 00:16 |",
        "| total | 11:40 | 12:00 |",
    ]


def test_step_times_table_for_the_terminal(timed: Path) -> None:
    console = Console(file=io.StringIO(), width=120)
    console.print(render_step_table(collect_step_times(timed)))
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "environment" in text and "10:10" in text and "06:28" in text and "other" in text


def test_a_step_without_a_time_leaves_other_unknown(tmp_path: Path) -> None:
    cell = tmp_path / "cpu"
    cell.mkdir()
    steps = [{"name": "environment", "status": "failed"}]
    (cell / "result.json").write_text(json.dumps({"cell": "cpu", "steps": steps}))
    (row,) = collect_step_times(tmp_path)
    assert row.other is None and row.slowest is None
    assert "| environment | -! |" in render_step_markdown([row])


def test_the_summary_prints_step_times_also_for_github(
    timed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    cli.main(["summary", "--artifacts", str(timed)])
    output = capsys.readouterr().out
    assert "matrix: step times" in output and "10:10" in output
    markdown = step_summary.read_text()
    assert "### matrix: step times" in markdown and "| tests | **06:28** | 01:30! |" in markdown
