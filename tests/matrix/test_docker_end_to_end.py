"""End to end on a real Docker engine: the build image, the read-only repository, failures.

Skipped (with the reason) when no daemon answers. The image is the one the
matrix uses, so a later `nox -s build-<cell>` reuses it.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix.job import Job
from fallback_matrix.matrix import Cell, expand_cells, load_matrix, pick_cells
from fallback_matrix.report import Reporter
from fallback_matrix.runners import (
    LABEL,
    connect_docker,
    docker_problem,
    ensure_image,
    plan_container,
    plan_image,
    run_container,
)
from fallback_matrix.running import run_cell
from fallback_matrix.wheelhouse import MANIFEST_NAME, dependency_groups, wheelhouse_name

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    if problem := docker_problem():
        pytest.skip(f"no Docker daemon: {problem}")
    client = connect_docker()
    yield client
    client.close()


@pytest.fixture
def volume(client: Any) -> Iterator[str]:
    name = f"fallback-matrix-test-{uuid.uuid4().hex[:8]}"
    yield name
    for found in client.volumes.list(filters={"name": name}):
        found.remove(force=True)


class CommandRunner:
    """The Docker runner with the job replaced by a shell command."""

    name = "docker"

    def __init__(self, client: Any, volume: str, script: str) -> None:
        self.client, self.volume, self.script = client, volume, script

    def run(self, job: Job, log: Reporter) -> tuple[int, str]:
        image = ensure_image(self.client, plan_image(Path(job.repo), job), log)
        inside, create = plan_container(job, image, volume=self.volume)
        create["command"] = ["sh", "-c", self.script]
        return run_container(
            self.client, inside, create, log, Path(job.artifacts)
        ), f"image {image}"


def fake_complete_wheelhouse(cache: Path, cell: Cell, repo: Path) -> None:
    groups = dependency_groups(repo / "pyproject.toml")
    path = cache / "wheelhouse" / wheelhouse_name(cell, groups)
    path.mkdir(parents=True)
    path.chmod(0o755)
    (path / MANIFEST_NAME).write_text(json.dumps({"test": True}))
    (path / "packaging-25.0-py3-none-any.whl").touch()  # what the job imports (its PYTHONPATH)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FALLBACK_MATRIX_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_script(repo_root: Path, tmp_path: Path, client: Any, volume: str, script: str) -> Any:
    matrix = load_matrix(repo_root / "matrix.yaml")
    (cell,) = pick_cells(expand_cells(matrix.spec), [matrix.spec.project_tests.cell])
    fake_complete_wheelhouse(tmp_path / "cache", cell, repo_root)
    return run_cell(
        matrix,
        cell,
        CommandRunner(client, volume, script),
        out=tmp_path / "artifacts" / cell.name,
        reporter=Reporter(),
    )


def test_the_image_runs_a_job_with_the_repository_read_only(
    repo_root: Path, tmp_path: Path, client: Any, volume: str
) -> None:
    script = (
        "set -e; id -u; test -r /src/pyproject.toml; ! touch /src/write-probe 2>/dev/null; "
        "touch /cache/write-probe; command -v g++ ccache; test -e /usr/lib/ccache/c++; "
        "python3 -c 'import sys; print(sys.version)'; echo wheel > /out/probe.txt"
    )
    result = run_script(repo_root, tmp_path, client, volume, script)
    log = (tmp_path / "artifacts" / "cpu" / "cell.log").read_text()
    assert result["exit_code"] == 0, log
    assert "\n1000\n" in log  # not root
    assert (tmp_path / "artifacts" / "cpu" / "probe.txt").read_text() == "wheel\n"
    assert_container_removed(client, log)


def test_a_failing_job_gives_a_nonzero_status_naming_the_cell(
    repo_root: Path, tmp_path: Path, client: Any, volume: str
) -> None:
    result = run_script(repo_root, tmp_path, client, volume, "echo about to fail; exit 3")
    assert result["exit_code"] == 3
    assert result["error"] is not None
    assert "cell cpu failed" in result["error"]
    assert str(tmp_path / "artifacts" / "cpu" / "cell.log") in result["error"]
    log = (tmp_path / "artifacts" / "cpu" / "cell.log").read_text()
    assert "about to fail" in log
    assert_container_removed(client, log)


def test_a_container_killed_mid_job_fails_the_cell_and_leaves_no_container(
    repo_root: Path, tmp_path: Path, client: Any, volume: str
) -> None:
    killed: list[str] = []

    def kill_when_running() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for container in client.containers.list(filters={"label": LABEL}):
                if container.name.startswith("fallback-matrix-cpu-"):
                    container.kill()
                    killed.append(container.name)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_running)
    killer.start()
    result = run_script(repo_root, tmp_path, client, volume, "echo building; sleep 120")
    killer.join()
    assert killed, "the job's container never ran"
    assert result["exit_code"] == 137
    assert "cell cpu failed" in result["error"] and "killed by SIGKILL" in result["error"]
    assert str(tmp_path / "artifacts" / "cpu" / "cell.log") in result["error"]
    assert client.containers.list(all=True, filters={"label": LABEL, "name": killed[0]}) == []


def assert_container_removed(client: Any, log: str) -> None:
    match = re.search(r"container (fallback-matrix-cpu-[0-9a-f]+) ", log)
    assert match, log
    assert client.containers.list(all=True, filters={"label": LABEL, "name": match.group(1)}) == []


@pytest.mark.slow
def test_a_cell_runs_with_its_cache_bind_mounted_from_another_users_directory(
    repo_root: Path, tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As on a hosted runner: the workspace's cache directory belongs to uid 1001, not to
    the image's user (1000). The whole cpu cell runs with it as /cache, and everything
    it leaves there belongs to the directory's owner (so actions/cache can save it)."""
    import os
    import shutil

    from fallback_matrix.runners import DOCKER_CACHE_ENV, IMAGE_UID, DockerRunner

    monkeypatch.delenv("FALLBACK_MATRIX_CACHE")  # the repository's wheelhouses and images

    matrix = load_matrix(repo_root / "matrix.yaml")
    (cell,) = pick_cells(expand_cells(matrix.spec), ["cpu"])
    cache = tmp_path / "workspace-cache"
    cache.mkdir()
    if os.geteuid() == 0:
        os.chown(cache, 1001, 1001)
    owner = cache.stat().st_uid
    assert owner not in (IMAGE_UID, 0)
    monkeypatch.setenv(DOCKER_CACHE_ENV, str(cache))  # as the workflows set it
    try:
        result = run_cell(
            matrix,
            cell,
            DockerRunner(),
            out=tmp_path / "artifacts" / cell.name,
            reporter=Reporter(),
        )
        log = (tmp_path / "artifacts" / cell.name / "cell.log").read_text()
        assert result["exit_code"] == 0, log[-4000:]
        assert "Permission denied" not in log
        assert (cache / "envs").is_dir() and (cache / "ccache").is_dir()
        assert {path.lstat().st_uid for path in cache.rglob("*")} == {owner}
        assert list((tmp_path / "artifacts" / "cpu").glob("torch_fallback-*manylinux*.whl"))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
