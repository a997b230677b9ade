"""The build image's tag is derived from the Dockerfile's directory and the build args."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix.errors import CellError, MatrixError
from fallback_matrix.job import Job
from fallback_matrix.matrix import LoadedMatrix, MatrixFile, expand_cells
from fallback_matrix.runners import LABEL, plan_image
from fallback_matrix.running import make_job

BASE = "python:3.11-slim-bookworm"


JOB_FIELDS: dict[str, Any] = {
    "cell": "cpu",
    "python": "3.11",
    "torch": "2.13.0+cpu",
    "cuda": None,
    "test_paths": ["tests"],
    "test_markers": "not requires_cuda",
    "gpu": False,
    "sources": [],
    "repo": "/repo",
    "wheelhouse": "/wheelhouse",
    "cache": "/cache",
    "work": "/work",
    "artifacts": "/out",
}


def jobs_of(matrix_data: dict[str, Any], repo: Path) -> list[Job]:
    spec = MatrixFile.model_validate(matrix_data)
    matrix = LoadedMatrix(repo / "matrix.yaml", spec)
    cells = expand_cells(spec)
    return [make_job(matrix, cell, repo / ".cache", repo / "out", wheelhouse="") for cell in cells]


@pytest.fixture
def context(tmp_path: Path) -> Path:
    directory = tmp_path / "docker"
    directory.mkdir()
    (directory / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN true\n")
    return directory


def image_tag(context: Path, base: str = BASE) -> str:
    job = Job(**{**JOB_FIELDS, "repo": str(context.parent), "base_image": base})
    return str(plan_image(context.parent, job)["tag"])


def test_unchanged_inputs_give_the_same_tag(context: Path) -> None:
    assert image_tag(context) == image_tag(context)


def test_tag_names_the_repository(context: Path) -> None:
    repository, _, digest = image_tag(context).partition(":")
    assert repository == "torch-fallback-build"
    assert len(digest) == 12


def test_a_dockerfile_change_gives_a_new_tag(context: Path) -> None:
    before = image_tag(context)
    (context / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo changed\n")
    assert image_tag(context) != before


def test_a_build_arg_change_gives_a_new_tag(context: Path) -> None:
    assert image_tag(context) != image_tag(context, "python:3.12-slim-bookworm")


def test_a_new_context_file_gives_a_new_tag(context: Path) -> None:
    before = image_tag(context)
    (context / "requirements.txt").write_text("x\n")
    assert image_tag(context) != before


def test_plan_uses_the_cell_base_as_build_arg(repo_root: Path, matrix_data: dict[str, Any]) -> None:
    matrix_data["cells"][0]["image"] = {"base": "debian:bookworm-slim"}
    cpu, cuda, _ = jobs_of(matrix_data, repo_root)
    plan_cpu, plan_cuda = plan_image(repo_root, cpu), plan_image(repo_root, cuda)
    assert plan_cpu["buildargs"] == {"BASE_IMAGE": "debian:bookworm-slim"}
    assert plan_cpu["path"] == str(repo_root / "docker")
    assert plan_cpu["tag"] != plan_cuda["tag"]
    assert plan_cpu["labels"] == {LABEL: "image"}  # `clean --caches` finds it


def test_a_job_needs_a_git_checkout(tmp_path: Path, matrix_data: dict[str, Any]) -> None:
    with pytest.raises(MatrixError, match=r"is not a git checkout.*clone the repo"):
        jobs_of(matrix_data, tmp_path)


def test_plan_names_a_missing_dockerfile(tmp_path: Path, matrix_data: dict[str, Any]) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    job = jobs_of(matrix_data, tmp_path)[0]
    with pytest.raises(CellError, match=r"cell cpu: Dockerfile .* not found"):
        plan_image(tmp_path, job)
