"""The Docker runner against a mocked client: images, mounts, GPUs, logs, and cleanup."""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

import docker
from fallback_matrix.cell_job import Job
from fallback_matrix.cells import expand_cells
from fallback_matrix.errors import ImageBuildError, RunnerUnavailableError
from fallback_matrix.image import ImagePlan
from fallback_matrix.model import MatrixFile
from fallback_matrix.runners.base import CellWork
from fallback_matrix.runners.docker_runner import (
    CELL_LABEL,
    LABEL,
    DockerRunner,
    ensure_image,
    execute,
    extract_archive,
    lines_of,
    plan_container,
)


@pytest.fixture
def work(matrix_data: dict[str, Any], repo_root: Path, tmp_path: Path) -> CellWork:
    cell = expand_cells(MatrixFile.model_validate(matrix_data))[0]
    return CellWork(
        cell=cell,
        sources=("pyproject.toml",),
        repo=repo_root,
        wheelhouse=tmp_path / "wheelhouse",
        artifacts=tmp_path / "artifacts" / "cpu",
        cache_root=tmp_path / "cache",
        gpus=False,
    )


def out_archive(files: dict[str, bytes]) -> Iterator[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, payload in files.items():
            info = tarfile.TarInfo(f"out/{name}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return iter([buffer.getvalue()])


def fake_container(
    exit_code: int = 0, logs: list[bytes] | None = None, logs_error: BaseException | None = None
) -> MagicMock:
    container = MagicMock(name="container")
    if logs_error is not None:
        container.logs.side_effect = logs_error
    else:
        container.logs.return_value = iter(logs or [b"hello\nwor", b"ld\n"])
    container.wait.return_value = {"StatusCode": exit_code}
    container.get_archive.return_value = (out_archive({"junit.xml": b"<testsuite/>"}), {})
    return container


def fake_client(container: MagicMock) -> MagicMock:
    client = MagicMock(name="client")
    client.containers.create.return_value = container
    return client


def test_plan_mounts_repo_and_wheelhouse_read_only(work: CellWork) -> None:
    plan = plan_container(work, "torch-fallback-build:abc", volume="cache-volume", suffix="x1")
    mounts = {mount.target: mount for mount in plan.mounts}
    assert mounts["/src"].source == str(work.repo) and mounts["/src"].read_only
    assert mounts["/wheelhouse"].source == str(work.wheelhouse) and mounts["/wheelhouse"].read_only
    assert mounts["/cache"].kind == "volume" and mounts["/cache"].source == "cache-volume"
    assert not mounts["/cache"].read_only
    assert plan.name == "fallback-matrix-cpu-x1"
    assert plan.labels == {LABEL: "1", CELL_LABEL: "cpu"}
    # the job is the package's own module, found in the mounted src/ (working directory)
    assert plan.command == [
        "python3",
        "-m",
        "fallback_matrix.cell_job",
        "/tmp/fallback-matrix-job.json",
    ]


def test_plan_job_uses_container_paths(work: CellWork) -> None:
    job = Job.from_json(plan_container(work, "img").job_json)
    assert (job.repo, job.wheelhouse, job.cache, job.artifacts) == (
        "/src",
        "/wheelhouse",
        "/cache",
        "/out",
    )
    assert job.torch_requirement == "torch==2.13.0+cpu"
    assert job.expected_cuda is None
    assert job.test_markers == "not requires_cuda"


def test_plan_passes_ci_through(work: CellWork) -> None:
    assert plan_container(work, "img", environ={"CI": "true"}).environment["CI"] == "true"
    assert "CI" not in plan_container(work, "img", environ={}).environment


def test_gpus_only_when_asked_or_needed(work: CellWork, matrix_data: dict[str, Any]) -> None:
    assert not plan_container(work, "img").gpus
    assert plan_container(CellWork(**{**work.__dict__, "gpus": True}), "img").gpus
    gpu_cell = expand_cells(MatrixFile.model_validate(matrix_data))[2]
    assert plan_container(CellWork(**{**work.__dict__, "cell": gpu_cell}), "img").gpus


def test_an_existing_image_is_reused(cell_log: Any) -> None:
    client = MagicMock()
    plan = ImagePlan(Path("/ctx"), "Dockerfile", {"BASE_IMAGE": "b"}, "torch-fallback-build:abc")
    assert ensure_image(client, plan, cell_log) == plan.tag
    client.api.build.assert_not_called()


def test_a_missing_image_is_built_with_its_args(cell_log: Any) -> None:
    client = MagicMock()
    client.images.get.side_effect = docker.errors.ImageNotFound("nope")
    client.api.build.return_value = iter(
        [{"stream": "Step 1/3\n"}, {"stream": "Successfully built\n"}]
    )
    plan = ImagePlan(Path("/ctx"), "Dockerfile", {"BASE_IMAGE": "b"}, "torch-fallback-build:abc")
    ensure_image(client, plan, cell_log)
    kwargs = client.api.build.call_args.kwargs
    assert kwargs["tag"] == plan.tag and kwargs["buildargs"] == {"BASE_IMAGE": "b"}
    assert "Step 1/3" in cell_log.path.read_text()


def test_an_image_build_failure_names_the_cell_and_log(cell_log: Any) -> None:
    client = MagicMock()
    client.images.get.side_effect = docker.errors.ImageNotFound("nope")
    client.api.build.return_value = iter([{"error": "apt-get failed"}])
    plan = ImagePlan(Path("/ctx"), "Dockerfile", {}, "torch-fallback-build:abc")
    with pytest.raises(
        ImageBuildError,
        match=r"cell cpu: building image .* failed: apt-get failed; log: .*cell.log",
    ):
        ensure_image(client, plan, cell_log)


def test_a_passing_container_streams_logs_copies_artifacts_and_is_removed(
    work: CellWork, cell_log: Any
) -> None:
    container = fake_container(exit_code=0)
    client = fake_client(container)
    status = execute(client, plan_container(work, "img"), cell_log, work.artifacts)
    assert status == 0
    assert "hello\nworld\n" in cell_log.path.read_text()
    assert (work.artifacts / "junit.xml").read_bytes() == b"<testsuite/>"
    container.put_archive.assert_called_once()
    container.remove.assert_called_once_with(force=True)
    kwargs = client.containers.create.call_args.kwargs
    assert kwargs["network_mode"] == "none"
    assert kwargs["device_requests"] is None
    assert kwargs["labels"][LABEL] == "1"
    assert all(
        mount["ReadOnly"]
        for mount in kwargs["mounts"]
        if mount["Target"] in ("/src", "/wheelhouse")
    )


def test_a_failing_container_returns_its_status_and_is_removed(
    work: CellWork, cell_log: Any
) -> None:
    container = fake_container(exit_code=1)
    assert (
        execute(fake_client(container), plan_container(work, "img"), cell_log, work.artifacts) == 1
    )
    container.remove.assert_called_once_with(force=True)


def test_ctrl_c_removes_the_container(work: CellWork, cell_log: Any) -> None:
    container = fake_container(logs_error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        execute(fake_client(container), plan_container(work, "img"), cell_log, work.artifacts)
    container.remove.assert_called_once_with(force=True)


def test_gpu_request_without_gpu_support_is_explained(work: CellWork, cell_log: Any) -> None:
    container = fake_container()
    container.start.side_effect = docker.errors.APIError(
        "500", explanation='could not select device driver "" with capabilities: [[gpu]]'
    )
    client = fake_client(container)
    plan = plan_container(CellWork(**{**work.__dict__, "gpus": True}), "img")
    with pytest.raises(
        RunnerUnavailableError, match="cell cpu: Docker cannot give the container a GPU"
    ):
        execute(client, plan, cell_log, work.artifacts)
    assert client.containers.create.call_args.kwargs["device_requests"][0]["Capabilities"] == [
        ["gpu"]
    ]
    container.remove.assert_called_once_with(force=True)


def test_runner_builds_or_reuses_image_then_runs(work: CellWork, cell_log: Any) -> None:
    container = fake_container(exit_code=0)
    client = fake_client(container)
    outcome = DockerRunner(connect=lambda: client).run(work, cell_log)
    assert outcome.exit_code == 0
    assert "torch-fallback-build:" in outcome.where
    assert client.containers.create.call_args.kwargs["image"].startswith("torch-fallback-build:")


def test_lines_of_joins_split_chunks() -> None:
    assert list(lines_of([b"a\nb", b"c\n", b"d"])) == ["a", "bc", "d"]


def test_extract_archive_drops_the_top_folder(tmp_path: Path) -> None:
    names = extract_archive(out_archive({"x.whl": b"1", "junit.xml": b"2"}), tmp_path)
    assert sorted(names) == ["junit.xml", "x.whl"]
    assert (tmp_path / "x.whl").read_bytes() == b"1"


# --- a host directory as the cache: the job runs as its owner -------------------------------------


def _stat(uid: int, gid: int) -> Any:
    return lambda path: os.stat_result((0o40755, 0, 0, 2, uid, gid, 0, 0, 0, 0))


def test_a_host_cache_directory_makes_the_job_run_as_its_owner() -> None:
    from fallback_matrix.runners.docker_runner import cache_user

    # a hosted runner's workspace belongs to uid 1001, the image's user is 1000
    assert cache_user("/home/runner/work/cache", stat=_stat(1001, 118)) == "1001:118"
    assert cache_user("/cache", stat=_stat(0, 0)) is None  # root's: handed to the image user
    assert cache_user("torch-fallback-matrix-cache") is None  # a named volume


def test_the_plan_carries_the_user_and_the_network(work: CellWork) -> None:
    plan = plan_container(work, "img:tag", volume="/ci/cache", user="1001:118")
    assert plan.user == "1001:118" and plan.network == "none"
    assert plan.environment["HOME"] == "/tmp"  # a uid without a passwd entry still has a HOME
    client = fake_client(fake_container())
    execute(client, plan, MagicMock(), Path("/tmp/unused-artifacts"))
    kwargs = client.containers.create.call_args.kwargs
    assert kwargs["user"] == "1001:118" and kwargs["network_mode"] == "none"
    from_index = dataclasses.replace(work, index_url="http://127.0.0.1:1/simple/", requirement="x")
    assert plan_container(from_index, "img:tag").network == "host"  # reaches the local index
