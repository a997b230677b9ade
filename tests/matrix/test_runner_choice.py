"""Choosing a runner, and the errors when one cannot run here."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import docker
from fallback_matrix import runners
from fallback_matrix.errors import EXIT_OK, DockerUnavailableError, MatrixError
from fallback_matrix.report import Reporter
from fallback_matrix.runners import (
    choose_runner,
    connect_docker,
    docker_problem,
    find_python,
)


@pytest.fixture
def no_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**_: object) -> None:
        raise docker.errors.DockerException(
            "Error while fetching server API version: ('Connection aborted.', FileNotFoundError(2))"
        )

    monkeypatch.setattr(docker, "from_env", refuse)


def test_no_daemon_says_how_to_start_one_or_use_local(no_daemon: None) -> None:
    with pytest.raises(DockerUnavailableError) as caught:
        connect_docker()
    message = str(caught.value)
    assert "no Docker daemon answers" in message
    assert "Start the Docker daemon" in message
    assert "--runner local" in message


def test_asking_for_docker_without_a_daemon_fails_clearly(no_daemon: None) -> None:
    with pytest.raises(DockerUnavailableError, match="Start the Docker daemon"):
        choose_runner("docker")


def test_the_docker_probe_reports_instead_of_raising(no_daemon: None) -> None:
    problem = docker_problem()
    assert problem is not None and "Start the Docker daemon" in problem


def test_auto_picks_local_without_a_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runners, "docker_problem", lambda: "no daemon")
    runner, reason = choose_runner("auto")
    assert runner.name == "local"
    assert "auto" in reason


def test_auto_picks_docker_when_a_daemon_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runners, "docker_problem", lambda: None)
    runner, reason = choose_runner("auto")
    assert runner.name == "docker"
    assert reason == "auto: a Docker daemon answers"


def test_local_is_local_without_asking_docker(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_be_called() -> str | None:
        raise AssertionError("local must not probe Docker")

    monkeypatch.setattr(runners, "docker_problem", must_not_be_called)
    assert choose_runner("local")[0].name == "local"


def test_local_runner_uses_this_python_when_versions_match() -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert find_python(version) == sys.executable


def test_local_runner_explains_a_missing_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(MatrixError, match=r"no Python 3\.99 here.*--runner docker"):
        find_python("3.99")


def test_a_python_of_another_version_is_found_under_pyenv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    from fallback_matrix import runners as local

    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    python = tmp_path / "versions" / "3.10.13" / "bin" / "python3.10"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\necho 3.10\n")  # a stand-in that answers as Python 3.10
    python.chmod(0o755)
    assert local.find_python("3.10") == str(python)
    with pytest.raises(MatrixError, match=r"no Python 3\.9 here.*install Python 3\.9"):
        local.find_python("3.9")


# --- one cell from the host's side: wheelhouse, job, runner, result -------------------------------


class FakeRunner:
    name = "fake"

    def __init__(self, status: int) -> None:
        self.status, self.jobs = status, []  # type: ignore[var-annotated]

    def run(self, job: object, log: Reporter) -> tuple[int, str]:
        self.jobs.append(job)
        log.say("the job ran")
        return self.status, "a fake runner"


@pytest.fixture
def cpu_cell_with_wheelhouse(repo_root: Path, tmp_path: Path, cpu_cell: Any) -> Any:
    """The cpu cell (matrix, cell) and its complete wheelhouse: nothing to download."""
    from fallback_matrix.wheelhouse import MANIFEST_NAME, wheelhouse_path

    matrix, cell = cpu_cell
    wheelhouse = wheelhouse_path(cell, repo_root / "pyproject.toml", tmp_path / "cache")
    wheelhouse.mkdir(parents=True)
    (wheelhouse / MANIFEST_NAME).write_text("{}")
    return matrix, cell, wheelhouse


@pytest.mark.parametrize("status", [0, 137])
def test_run_cell_gives_the_job_its_wheelhouse_and_records_the_result(
    tmp_path: Path, cpu_cell_with_wheelhouse: Any, status: int
) -> None:
    import json

    from fallback_matrix.running import run_cell

    matrix, cell, wheelhouse = cpu_cell_with_wheelhouse
    runner = FakeRunner(status)
    result = run_cell(matrix, cell, runner, out=tmp_path / "out" / "cpu", reporter=Reporter())
    (job,) = runner.jobs
    assert job.wheelhouse == str(wheelhouse) and job.torch == "2.13.0+cpu"
    assert "the job ran" in (tmp_path / "out" / "cpu" / "cell.log").read_text()
    record = json.loads((tmp_path / "out" / "cpu" / "result.json").read_text())
    assert (record["runner"], record["exit_code"], record["where"]) == (
        "fake",
        status,
        "a fake runner",
    )
    if status:
        assert result["error"] is not None and "killed by SIGKILL" in result["error"]
    else:
        assert result["error"] is None


def test_a_passed_result_stands_for_the_same_job_on_the_same_sources_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_cell_with_wheelhouse: Any
) -> None:
    from fallback_matrix.running import REUSE_PASSED_ENV, run_cell

    matrix, cell, _ = cpu_cell_with_wheelhouse
    out = tmp_path / "out" / "cpu"

    def runs(runner: FakeRunner, **options: object) -> int:
        before = len(runner.jobs)
        run_cell(matrix, cell, runner, out=out, reporter=Reporter(), **options)
        return len(runner.jobs) - before

    failing, passing = FakeRunner(1), FakeRunner(0)
    monkeypatch.setenv(REUSE_PASSED_ENV, "1")
    assert runs(failing) == 1 and runs(failing) == 1  # a failed result never stands
    assert runs(passing) == 1 and runs(passing) == 0  # the same job: the passed result stands
    assert runs(passing, cache_cap=1024) == 1  # another job (an option differs) runs
    monkeypatch.delenv(REUSE_PASSED_ENV)
    assert runs(passing, cache_cap=1024) == 1  # unasked, every run runs


def test_clean_removes_leftovers_and_with_caches_the_caches(
    repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unittest.mock import MagicMock

    from fallback_matrix import cli, runners

    cache = tmp_path / "cache"
    (cache / "wheelhouse" / ".torch-x.partial").mkdir(parents=True)
    (cache / "wheelhouse" / "torch-x").mkdir()
    monkeypatch.setenv("FALLBACK_MATRIX_CACHE", str(cache))
    client = MagicMock()
    leftover = MagicMock()
    client.containers.list.return_value = [leftover]
    monkeypatch.setattr(runners, "docker_problem", lambda: None)
    monkeypatch.setattr(runners, "connect_docker", lambda: client)
    matrix = ["--matrix", str(repo_root / "matrix.yaml")]

    assert cli.main([*matrix, "clean"]) == EXIT_OK
    assert client.containers.list.call_args.kwargs["filters"] == {"label": runners.LABEL}
    leftover.remove.assert_called_once_with(force=True)
    assert not (cache / "wheelhouse" / ".torch-x.partial").exists()
    assert (cache / "wheelhouse" / "torch-x").is_dir()  # a complete wheelhouse stays
    client.volumes.list.assert_not_called()

    run_dir = tmp_path / "run-cache"  # a host directory as the Docker cache (a GPU job's)
    (run_dir / "ccache").mkdir(parents=True)
    monkeypatch.setenv(runners.DOCKER_CACHE_ENV, str(run_dir))
    assert cli.main([*matrix, "clean", "--caches"]) == EXIT_OK
    assert client.volumes.list.call_args.kwargs["filters"] == {"name": runners.CACHE_VOLUME}
    assert not cache.exists() and not run_dir.exists()
