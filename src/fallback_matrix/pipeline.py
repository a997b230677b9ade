"""Run cells one after another: wheelhouse on the host, then the job in its runner."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .cells import Cell
from .errors import MatrixError
from .loader import LoadedMatrix
from .project import dependency_groups
from .report import Reporter
from .runners.base import CellWork, Runner
from .sources import source_files
from .summary import LOG_FILE, RESULT_FILE, read_json
from .wheelhouse import WheelhouseRequest, ensure_wheelhouse


@dataclass(frozen=True)
class CellResult:
    cell: str
    runner: str
    exit_code: int
    seconds: float
    log: Path
    error: str | None

    @property
    def passed(self) -> bool:
        return self.exit_code == 0


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def exit_reason(exit_code: int) -> str:
    """Why a job ended with this status, where the status itself says so."""
    if exit_code == 137:
        return ": killed by SIGKILL, e.g. docker kill or the out-of-memory killer"
    if exit_code == 143:
        return ": stopped by SIGTERM, e.g. docker stop"
    return ""


def run_cell(
    matrix: LoadedMatrix,
    cell: Cell,
    runner: Runner,
    *,
    cache_root: Path,
    artifacts_root: Path,
    gpus: bool,
    reporter: Reporter,
    prebuilt_wheel: Path | None = None,
    index_url: str | None = None,
    requirement: str | None = None,
) -> CellResult:
    """Run one cell; failures end up in the result (and its log), never as an exception."""
    artifacts = _fresh_dir(artifacts_root / cell.name)
    started = time.monotonic()
    error: str | None = None
    exit_code = 1
    where: str = runner.name
    with reporter.for_cell(cell.name, artifacts / LOG_FILE) as log:
        log.say(
            f"torch=={cell.torch} ({cell.variant}), Python {cell.python}, "
            f"tests {' '.join(cell.tests.paths)} "
            f"-m {cell.tests.markers!r}, index {cell.index.url} ({cell.index.source})"
        )
        try:
            pyproject = matrix.root / "pyproject.toml"
            request = WheelhouseRequest.for_cell(cell, dependency_groups(pyproject), pyproject)
            wheelhouse = ensure_wheelhouse(
                request, cell.index.url, cache_root, log, variant=cell.variant
            )
            work = CellWork(
                cell=cell,
                sources=source_files(matrix.root),
                repo=matrix.root,
                wheelhouse=wheelhouse,
                artifacts=artifacts,
                cache_root=cache_root,
                gpus=gpus,
                prebuilt_wheel=prebuilt_wheel,
                index_url=index_url,
                requirement=requirement,
            )
            outcome = runner.run(work, log)
            exit_code, where = outcome.exit_code, outcome.where
            if exit_code != 0:
                error = (
                    f"cell {cell.name} failed in {where} (exit status {exit_code}"
                    f"{exit_reason(exit_code)}); log: {log.path}"
                )
        except MatrixError as problem:
            error = str(problem)
            if cell.name not in error:
                error = f"cell {cell.name}: {error}"
            log.line(f"error: {error}")
    seconds = round(time.monotonic() - started, 1)
    job_record = read_json(artifacts / RESULT_FILE)  # the job's steps, when it ran
    record = {
        **job_record,
        "cell": cell.name,
        "runner": runner.name,
        "where": where,
        "exit_code": exit_code,
        "seconds": seconds,
        "error": error or job_record.get("error"),
    }
    (artifacts / RESULT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return CellResult(cell.name, runner.name, exit_code, seconds, artifacts / LOG_FILE, error)


def run_cells(
    matrix: LoadedMatrix,
    cells: Sequence[Cell],
    runner: Runner,
    *,
    cache_root: Path,
    artifacts_root: Path,
    gpus: bool,
    reporter: Reporter,
) -> list[CellResult]:
    results = []
    for number, cell in enumerate(cells, start=1):
        reporter.rule(f"cell {cell.name} ({number}/{len(cells)}) - runner {runner.name}")
        result = run_cell(
            matrix,
            cell,
            runner,
            cache_root=cache_root,
            artifacts_root=artifacts_root,
            gpus=gpus,
            reporter=reporter,
        )
        state = "passed" if result.passed else "FAILED"
        reporter.say(f"{cell.name} {state} in {result.seconds:.0f}s (log {result.log})")
        results.append(result)
    return results
