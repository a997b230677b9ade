"""What every runner receives and returns."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from ..cell_job import Job
from ..cells import Cell
from ..project import CELL_GROUPS
from ..report import Reporter

RunnerName = Literal["docker", "local"]
RunnerChoice = Literal["docker", "local", "auto"]


@dataclass(frozen=True)
class CellWork:
    """One cell to run, with host paths; each runner maps them to where the job sees them."""

    cell: Cell
    sources: tuple[str, ...]
    repo: Path
    wheelhouse: Path
    artifacts: Path
    cache_root: Path
    gpus: bool
    prebuilt_wheel: Path | None = None  # a wheel under ``repo`` to test instead of building
    index_url: str | None = None  # install ``requirement`` from this index instead of building
    requirement: str | None = None

    def job(self, *, repo: str, wheelhouse: str, cache: str, work: str, artifacts: str) -> Job:
        tests = self.cell.tests
        return Job(
            cell=self.cell.name,
            torch_requirement=self.cell.torch_requirement,
            expected_cuda=self.cell.cuda,
            groups=list(CELL_GROUPS),
            test_paths=list(tests.paths),
            test_markers=tests.markers,
            allow_empty=tests.allow_empty,
            require_gpu=self.cell.gpu,
            sources=list(self.sources),
            repo=repo,
            wheelhouse=wheelhouse,
            cache=cache,
            work=work,
            artifacts=artifacts,
            prebuilt_wheel=(
                f"{repo}/{self.prebuilt_wheel.relative_to(self.repo).as_posix()}"
                if self.prebuilt_wheel
                else None
            ),
            plain_version=self.cell.pypi,
            index_url=self.index_url,
            requirement=self.requirement,
        )


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int
    where: str


class Runner(Protocol):
    name: RunnerName

    def run(self, work: CellWork, log: Reporter) -> RunOutcome: ...
