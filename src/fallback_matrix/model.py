"""The schema of matrix.yaml, as pydantic models.

The models only describe the file; `cells.expand_cells` turns a validated file
into the concrete cells a runner executes. Every field has a description: the
loader quotes it when the field is missing or wrong.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

VariantName = Literal["cpu", "cuda"]
SelectionName = Literal["pr", "main"]

CELL_NAME_PATTERN = r"^[a-z0-9]+(-[a-z0-9]+)*$"
PYTHON_PATTERN = r"^3\.[0-9]{1,2}$"
TORCH_PATTERN = r"^[0-9]+\.[0-9]+(\.[0-9]+)?((a|b|rc|\.dev|\.post)[0-9]+)*(\+[a-z0-9.]+)?$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


CellName = Annotated[
    str,
    Field(
        pattern=CELL_NAME_PATTERN,
        description='a cell name: lowercase letters, digits and single dashes, e.g. "cuda-gpu"',
    ),
]
PythonVersion = Annotated[
    str,
    Field(pattern=PYTHON_PATTERN, description='a Python version "3.X" as a quoted string'),
]


class ImageSpec(_Strict):
    """How a cell's build image is made: a Dockerfile and its base image (a build arg)."""

    dockerfile: str = Field(
        description="the Dockerfile's path from the repository root, e.g. docker/Dockerfile"
    )
    base: str = Field(description="the base image, e.g. python:3.11-slim-bookworm")


class ImageOverride(_Strict):
    dockerfile: str | None = Field(default=None, description="a Dockerfile path for this cell")
    base: str | None = Field(default=None, description="a base image for this cell")


class TestSelection(_Strict):
    """Which tests a cell runs against its freshly built wheel."""

    paths: list[str] = Field(
        min_length=1,
        description="test paths relative to the repository root, e.g. [tests/extension]",
    )
    markers: str = Field(
        min_length=1, description='a pytest -m expression, e.g. "not requires_cuda"'
    )
    allow_empty: bool = Field(
        default=False,
        description="true when selecting no test at all is legitimate for this cell",
    )


class TestOverride(_Strict):
    paths: list[str] | None = Field(default=None, min_length=1, description="test paths")
    markers: str | None = Field(default=None, min_length=1, description="a pytest -m expression")
    allow_empty: bool | None = Field(default=None, description="true or false")


class Defaults(_Strict):
    """Values every cell gets unless it sets its own."""

    python: PythonVersion
    image: ImageSpec
    tests: TestSelection
    runner: str = Field(description="a key of `runners`: where cells run on GitHub")
    selections: list[SelectionName] = Field(
        min_length=1, description="the workflows a cell belongs to: pr, main or both"
    )


class VariantSpec(_Strict):
    """Where one torch variant is downloaded from."""

    index_url: str = Field(
        pattern=r"^(https?|file)://",
        description="the package index a GitHub runner installs torch from (an http(s) URL)",
    )
    index_url_env: str = Field(
        pattern=r"^[A-Z][A-Z0-9_]*$",
        description="the environment variable that overrides index_url, "
        "e.g. FALLBACK_MATRIX_INDEX_URL_CPU",
    )


class CellSpec(_Strict):
    """One cell: a torch variant and version on one Python, built and tested in one image."""

    name: CellName
    variant: VariantName = Field(description="the torch variant: cpu or cuda (a key of `variants`)")
    torch: str = Field(
        pattern=TORCH_PATTERN,
        description='the exact torch version to pin, as a string, e.g. "2.13.0+cpu"',
    )
    cuda: str | None = Field(
        default=None,
        pattern=r"^[0-9]+$",
        description="for variant cuda: the CUDA major version torch.version.cuda must start "
        'with, e.g. "13"',
    )
    python: PythonVersion | None = None
    gpu: bool = Field(
        default=False,
        description="true when the cell's tests need a visible GPU (they fail without one)",
    )
    pypi: bool = Field(
        default=False,
        description="true for the cell whose wheels a release publishes to PyPI: built "
        "without the local version label (PyPI rejects +labels)",
    )
    runner: str | None = Field(default=None, description="a key of `runners`")
    selections: list[SelectionName] | None = Field(
        default=None, min_length=1, description="pr, main or both"
    )
    image: ImageOverride | None = None
    tests: TestOverride | None = None


class ProjectTests(_Strict):
    """What `nox -s tests` runs: one cell with the local runner, plus the tooling's own tests."""

    cell: CellName
    tooling_paths: list[str] = Field(
        min_length=1, description="test paths run on the host, e.g. [tests/matrix]"
    )


class MatrixFile(_Strict):
    """The whole of matrix.yaml."""

    version: Literal[1] = Field(description="the schema version of this file: 1")
    defaults: Defaults
    runners: dict[str, list[str]] = Field(
        min_length=1,
        description="named sets of GitHub runner labels, e.g. gpu: [self-hosted, linux, x64, gpu]",
    )
    variants: dict[VariantName, VariantSpec] = Field(
        min_length=1, description="index settings per torch variant (cpu, cuda)"
    )
    project_tests: ProjectTests
    cells: list[CellSpec] = Field(min_length=1, description="the list of cells")
