"""Expand a validated matrix into concrete cells: a pure function, no I/O.

Like pytorch/test-infra's generate_binary_build_matrix.py, the list of cells is
computed from settings alone (the file, the environment mapping and the
command-line overrides passed in), so it is tested as a function and reused
as-is by the CLI, nox and the workflow generator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .cell_job import describe_build
from .errors import MatrixError, UnknownCellError
from .model import ImageSpec, MatrixFile, SelectionName, TestSelection, VariantName


@dataclass(frozen=True)
class IndexUrl:
    """The index a cell's torch comes from, and which setting chose it."""

    url: str
    source: str


@dataclass(frozen=True)
class Cell:
    """Everything needed to build and test one cell, with defaults applied."""

    name: str
    variant: VariantName
    python: str
    torch: str
    cuda: str | None
    gpu: bool
    pypi: bool
    index: IndexUrl
    image: ImageSpec
    tests: TestSelection
    runner: str
    runner_labels: tuple[str, ...]
    selections: tuple[SelectionName, ...]

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch}"

    @property
    def wanted_build(self) -> str:
        """The torch build this cell must end up with, in words."""
        return describe_build(self.cuda)


def parse_index_override(text: str) -> tuple[VariantName, str]:
    """'cpu=https://...' -> ("cpu", "https://..."), as given to --index-url."""
    variant, separator, url = text.partition("=")
    if not separator or variant not in ("cpu", "cuda") or not url:
        raise MatrixError(
            f"--index-url {text!r}: expected VARIANT=URL with VARIANT cpu or cuda, "
            "e.g. --index-url cpu=https://download.pytorch.org/whl/cpu"
        )
    return variant, url  # type: ignore[return-value]


def _resolve_index(
    spec: MatrixFile,
    variant: VariantName,
    environ: Mapping[str, str],
    overrides: Mapping[VariantName, str],
) -> IndexUrl:
    settings = spec.variants[variant]
    if variant in overrides:
        return IndexUrl(overrides[variant], f"--index-url {variant}=...")
    from_env = environ.get(settings.index_url_env, "").strip()
    if from_env:
        return IndexUrl(from_env, f"${settings.index_url_env}")
    return IndexUrl(settings.index_url, f"matrix.yaml variants.{variant}.index_url")


def expand_cells(
    spec: MatrixFile,
    *,
    environ: Mapping[str, str] | None = None,
    index_overrides: Mapping[VariantName, str] | None = None,
    selection: SelectionName | None = None,
) -> tuple[Cell, ...]:
    """All cells of ``spec`` (or those in ``selection``: "pr" or "main"), defaults applied."""
    environ = environ or {}
    overrides = index_overrides or {}
    defaults = spec.defaults
    cells = []
    for cell in spec.cells:
        image = ImageSpec(
            dockerfile=(cell.image and cell.image.dockerfile) or defaults.image.dockerfile,
            base=(cell.image and cell.image.base) or defaults.image.base,
        )
        override = cell.tests
        tests = TestSelection(
            paths=(override and override.paths) or defaults.tests.paths,
            markers=(override and override.markers) or defaults.tests.markers,
            allow_empty=(
                override.allow_empty
                if override is not None and override.allow_empty is not None
                else defaults.tests.allow_empty
            ),
        )
        runner = cell.runner or defaults.runner
        selections = tuple(cell.selections or defaults.selections)
        if selection is not None and selection not in selections:
            continue
        cells.append(
            Cell(
                name=cell.name,
                variant=cell.variant,
                python=cell.python or defaults.python,
                torch=cell.torch,
                cuda=cell.cuda,
                gpu=cell.gpu,
                pypi=cell.pypi,
                index=_resolve_index(spec, cell.variant, environ, overrides),
                image=image,
                tests=tests,
                runner=runner,
                runner_labels=tuple(spec.runners[runner]),
                selections=selections,
            )
        )
    return tuple(cells)


def pick_cells(cells: Iterable[Cell], names: Iterable[str]) -> tuple[Cell, ...]:
    """The cells called ``names``, in the order asked; UnknownCellError names any unknown one."""
    by_name = {cell.name: cell for cell in cells}
    wanted = list(dict.fromkeys(names))
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise UnknownCellError(unknown, list(by_name))
    return tuple(by_name[name] for name in wanted)
