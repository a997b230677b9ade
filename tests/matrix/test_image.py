"""The build image's tag is derived from the Dockerfile's directory and the build args."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fallback_matrix.cells import expand_cells
from fallback_matrix.errors import ImageBuildError
from fallback_matrix.image import image_tag, plan_image
from fallback_matrix.model import MatrixFile

ARGS = {"BASE_IMAGE": "python:3.11-slim-bookworm"}


@pytest.fixture
def context(tmp_path: Path) -> Path:
    directory = tmp_path / "docker"
    directory.mkdir()
    (directory / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN true\n")
    return directory


def test_unchanged_inputs_give_the_same_tag(context: Path) -> None:
    assert image_tag(context, ARGS) == image_tag(context, dict(ARGS))


def test_tag_names_the_repository(context: Path) -> None:
    repository, _, digest = image_tag(context, ARGS).partition(":")
    assert repository == "torch-fallback-build"
    assert len(digest) == 12


def test_a_dockerfile_change_gives_a_new_tag(context: Path) -> None:
    before = image_tag(context, ARGS)
    (context / "Dockerfile").write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo changed\n")
    assert image_tag(context, ARGS) != before


def test_a_build_arg_change_gives_a_new_tag(context: Path) -> None:
    assert image_tag(context, ARGS) != image_tag(
        context, {"BASE_IMAGE": "python:3.12-slim-bookworm"}
    )


def test_a_new_context_file_gives_a_new_tag(context: Path) -> None:
    before = image_tag(context, ARGS)
    (context / "requirements.txt").write_text("x\n")
    assert image_tag(context, ARGS) != before


def test_plan_uses_the_cell_base_as_build_arg(repo_root: Path, matrix_data: dict[str, Any]) -> None:
    matrix_data["cells"][0]["image"] = {"base": "debian:bookworm-slim"}
    cpu, cuda, _ = expand_cells(MatrixFile.model_validate(matrix_data))
    plan_cpu, plan_cuda = plan_image(repo_root, cpu), plan_image(repo_root, cuda)
    assert plan_cpu.build_args == {"BASE_IMAGE": "debian:bookworm-slim"}
    assert plan_cpu.context == repo_root / "docker"
    assert plan_cpu.tag != plan_cuda.tag


def test_plan_names_a_missing_dockerfile(tmp_path: Path, matrix_data: dict[str, Any]) -> None:
    cell = expand_cells(MatrixFile.model_validate(matrix_data))[0]
    with pytest.raises(ImageBuildError, match=r"cell cpu: Dockerfile .* not found"):
        plan_image(tmp_path, cell)
