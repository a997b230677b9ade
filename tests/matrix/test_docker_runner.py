"""The Docker runner against a mocked client: images, mounts, GPUs, logs, and cleanup."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import MagicMock

import pytest

import docker
from fallback_matrix.errors import CellError, GpuUnavailableError, MatrixError
from fallback_matrix.job import Job
from fallback_matrix.matrix import LoadedMatrix, MatrixFile, expand_cells
from fallback_matrix.runners import (
    CELL_LABEL,
    LABEL,
    DockerRunner,
    container_user,
    ensure_image,
    extract_archive,
    lines_of,
    plan_container,
    run_container,
)
from fallback_matrix.running import make_job


@pytest.fixture
def work(matrix_data: dict[str, Any], repo_root: Path, tmp_path: Path) -> Job:
    """The job of the cpu cell, with host paths."""
    spec = MatrixFile.model_validate(matrix_data)
    cell = expand_cells(spec)[0]
    matrix = LoadedMatrix(repo_root / "matrix.yaml", spec)
    artifacts, wheelhouse = tmp_path / "artifacts" / "cpu", tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    (wheelhouse / "packaging-25.0-py3-none-any.whl").touch()
    return make_job(matrix, cell, tmp_path / "cache", artifacts, wheelhouse=str(wheelhouse))


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


def test_the_job_imports_this_package_and_the_wheelhouses_packaging(work: Job) -> None:
    _, plan = plan_container(work, "torch-fallback-build:abc")
    wheel = "/wheelhouse/packaging-25.0-py3-none-any.whl"
    assert plan["environment"]["PYTHONPATH"] == f"/src/src:{wheel}"
    (Path(work.wheelhouse) / "packaging-25.0-py3-none-any.whl").unlink()
    with pytest.raises(CellError, match="holds no packaging wheel"):
        plan_container(work, "torch-fallback-build:abc")


def test_plan_mounts_repo_and_wheelhouse_read_only(work: Job) -> None:
    _, plan = plan_container(work, "torch-fallback-build:abc", volume="cache-volume")
    mounts = {mount["Target"]: mount for mount in plan["mounts"]}
    assert mounts["/src"]["Source"] == work.repo and mounts["/src"]["ReadOnly"]
    assert mounts["/wheelhouse"]["Source"] == work.wheelhouse and mounts["/wheelhouse"]["ReadOnly"]
    assert mounts["/cache"]["Type"] == "volume" and mounts["/cache"]["Source"] == "cache-volume"
    assert not mounts["/cache"]["ReadOnly"]
    assert re.fullmatch(r"fallback-matrix-cpu-[0-9a-f]{8}", plan["name"])
    *command, job_json = plan["command"]
    assert command == ["python3", "-m", "fallback_matrix.job"]  # the job as it sees its paths
    assert Job(**json.loads(job_json)) == plan_container(work, "img", volume="cache-volume")[0]


def test_plan_job_uses_container_paths(work: Job) -> None:
    job, _ = plan_container(work, "img")
    assert (job.repo, job.wheelhouse, job.cache, job.artifacts) == (
        "/src",
        "/wheelhouse",
        "/cache",
        "/out",
    )
    assert job.torch == "2.13.0+cpu"
    assert job.cuda is None
    assert job.test_markers == "not requires_cuda"
    staged = dataclasses.replace(work, prebuilt_wheel=f"{work.repo}/.cache/test-wheel/cpu/x.whl")
    assert plan_container(staged, "img")[0].prebuilt_wheel == "/src/.cache/test-wheel/cpu/x.whl"


def test_plan_passes_ci_through(work: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    assert plan_container(work, "img")[1]["environment"]["CI"] == "true"
    monkeypatch.delenv("CI")
    assert "CI" not in plan_container(work, "img")[1]["environment"]


def test_gpus_only_when_asked_or_needed(work: Job) -> None:
    def requests(job: Job) -> Any:
        client = fake_client(fake_container())
        run_container(client, *plan_container(job, "img"), MagicMock(), Path("/tmp/unused"))
        return client.containers.create.call_args.kwargs["device_requests"]

    assert requests(work) is None
    assert requests(dataclasses.replace(work, gpus=True))
    assert requests(dataclasses.replace(work, gpu=True))  # a gpu cell


def image_plan(build_args: dict[str, str]) -> dict[str, Any]:
    tag = "torch-fallback-build:abc"
    return {"tag": tag, "path": "/ctx", "dockerfile": "Dockerfile", "buildargs": build_args}


def test_an_existing_image_is_reused(cell_log: Any) -> None:
    client = MagicMock()
    plan = image_plan({"BASE_IMAGE": "b"})
    assert ensure_image(client, plan, cell_log) == plan["tag"]
    client.api.build.assert_not_called()


def test_a_missing_image_is_built_with_its_args(cell_log: Any) -> None:
    client = MagicMock()
    client.images.get.side_effect = docker.errors.ImageNotFound("nope")
    client.api.build.return_value = iter(
        [{"stream": "Step 1/3\n"}, {"stream": "Successfully built\n"}]
    )
    plan = image_plan({"BASE_IMAGE": "b"})
    ensure_image(client, plan, cell_log)
    kwargs = client.api.build.call_args.kwargs
    assert kwargs["path"] == "/ctx" and kwargs["buildargs"] == {"BASE_IMAGE": "b"}
    assert "Step 1/3" in cell_log.path.read_text()


def test_an_image_build_failure_names_the_cell_and_log(cell_log: Any) -> None:
    client = MagicMock()
    client.images.get.side_effect = docker.errors.ImageNotFound("nope")
    client.api.build.return_value = iter([{"error": "apt-get failed"}])
    plan = image_plan({})
    with pytest.raises(
        CellError,
        match=r"cell cpu: building image .* failed: apt-get failed; log: .*cell.log",
    ):
        ensure_image(client, plan, cell_log)


def test_a_passing_container_streams_logs_copies_artifacts_and_is_removed(
    work: Job, cell_log: Any
) -> None:
    container = fake_container(exit_code=0)
    client = fake_client(container)
    status = run_container(client, *plan_container(work, "img"), cell_log, Path(work.artifacts))
    assert status == 0
    assert "hello\nworld\n" in cell_log.path.read_text()
    assert (Path(work.artifacts) / "junit.xml").read_bytes() == b"<testsuite/>"
    container.remove.assert_called_once_with(force=True)
    kwargs = client.containers.create.call_args.kwargs
    assert kwargs["network_mode"] == "none"
    assert kwargs["device_requests"] is None
    assert kwargs["labels"] == {LABEL: "1", CELL_LABEL: "cpu"}
    assert all(
        mount["ReadOnly"]
        for mount in kwargs["mounts"]
        if mount["Target"] in ("/src", "/wheelhouse")
    )


def test_a_failing_container_returns_its_status_and_is_removed(work: Job, cell_log: Any) -> None:
    container = fake_container(exit_code=1)
    assert (
        run_container(
            fake_client(container), *plan_container(work, "img"), cell_log, Path(work.artifacts)
        )
        == 1
    )
    container.remove.assert_called_once_with(force=True)


def test_ctrl_c_removes_the_container(work: Job, cell_log: Any) -> None:
    container = fake_container(logs_error=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run_container(
            fake_client(container), *plan_container(work, "img"), cell_log, Path(work.artifacts)
        )
    container.remove.assert_called_once_with(force=True)


def test_gpu_request_without_gpu_support_is_explained(work: Job, cell_log: Any) -> None:
    container = fake_container()
    container.start.side_effect = docker.errors.APIError(
        "500", explanation='could not select device driver "" with capabilities: [[gpu]]'
    )
    client = fake_client(container)
    plan = plan_container(dataclasses.replace(work, gpus=True), "img")
    with pytest.raises(
        GpuUnavailableError, match="cell cpu: Docker cannot give the container a GPU"
    ):
        run_container(client, *plan, cell_log, Path(work.artifacts))
    assert client.containers.create.call_args.kwargs["device_requests"][0]["Capabilities"] == [
        ["gpu"]
    ]
    container.remove.assert_called_once_with(force=True)


def test_runner_builds_or_reuses_image_then_runs(work: Job, cell_log: Any) -> None:
    container = fake_container(exit_code=0)
    client = fake_client(container)
    status, where = DockerRunner(client).run(work, cell_log)
    assert status == 0
    assert "torch-fallback-build:" in where
    assert client.containers.create.call_args.kwargs["image"].startswith("torch-fallback-build:")


def test_lines_of_joins_split_chunks() -> None:
    assert list(lines_of([b"a\nb", b"c\n", b"d"])) == ["a", "bc", "d"]


def test_extract_archive_drops_the_top_folder(tmp_path: Path) -> None:
    names = extract_archive(out_archive({"x.whl": b"1", "junit.xml": b"2"}), tmp_path)
    assert sorted(names) == ["junit.xml", "x.whl"]
    assert (tmp_path / "x.whl").read_bytes() == b"1"


# --- a host directory as the cache: the job runs as its owner -------------------------------------


def _stat(uid: int, gid: int, mode: int = 0o40755) -> Any:
    return lambda path: os.stat_result((mode, 0, 0, 2, uid, gid, 0, 0, 0, 0))


def test_a_host_cache_directory_makes_the_job_run_as_its_owner() -> None:
    # a hosted runner's workspace belongs to uid 1001, the image's user is 1000
    assert (
        container_user("/home/runner/work/cache", "/ci/repo", stat=_stat(1001, 118)) == "1001:118"
    )
    assert (
        container_user("/cache", "/ci/repo", stat=_stat(0, 0)) is None
    )  # root's: the image user's
    assert container_user("torch-fallback-matrix-cache", "/ci/repo", stat=_stat(0, 0)) is None


def test_the_plan_carries_the_user_and_the_network(work: Job) -> None:
    inside, plan = plan_container(work, "img:tag", volume="/ci/cache", user="1001:118")
    assert plan["user"] == "1001:118" and plan["network_mode"] == "none"
    assert plan["environment"]["HOME"] == "/tmp"  # a uid without a passwd entry still has a HOME
    client = fake_client(fake_container())
    run_container(client, inside, plan, MagicMock(), Path("/tmp/unused-artifacts"))
    kwargs = client.containers.create.call_args.kwargs
    assert kwargs["user"] == "1001:118" and kwargs["network_mode"] == "none"
    from_index = dataclasses.replace(work, index_url="http://127.0.0.1:1/simple/", requirement="x")
    assert (
        plan_container(from_index, "img:tag")[1]["network_mode"] == "host"
    )  # reaches the local index


def test_a_checkout_the_container_user_cannot_read_is_a_clear_error() -> None:
    with pytest.raises(MatrixError, match=r"mode 700.*uid 1000.*chmod o\+rx /ci/repo"):
        container_user("cache-volume", "/ci/repo", stat=_stat(0, 0, mode=0o40700))
    # Readable by others, or owned by the user the container runs as: fine.
    assert container_user("cache-volume", "/ci/repo", stat=_stat(0, 0)) is None
    owned = _stat(1001, 118, mode=0o40700)
    assert container_user("/ci/cache", "/ci/repo", stat=owned) == "1001:118"
