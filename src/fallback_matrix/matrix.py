"""matrix.yaml: its schema, loading with located errors, and its expansion into cells. Every
problem (YAML, a repeated key, the schema, references between keys) names the file, the line and
the key path (``cells[1].torch``); all end up in one MatrixFileError."""

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from .errors import MatrixError, MatrixFileError, Problem

MATRIX_FILE_NAME = "matrix.yaml"
VariantName = Literal["cpu", "cuda"]
SelectionName = Literal["pr", "main"]
KeyPath = tuple[str | int, ...]


# Every field's description is quoted when it is missing or wrong (_describe).
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


CELL_NAME = 'a cell name: lowercase letters, digits and single dashes, e.g. "cuda-gpu"'
CellName = Annotated[str, Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$", description=CELL_NAME)]
PythonVersion = Annotated[
    str, Field(pattern=r"^3\.[0-9]{1,2}$", description='a Python version "3.X" as a quoted string')
]
PYTHON_IMAGE = re.compile(r"^python:3\.[0-9]{1,2}(?=-|$)")
TORCH_PATTERN = r"^[0-9]+\.[0-9]+(\.[0-9]+)?((a|b|rc|\.dev|\.post)[0-9]+)*(\+[a-z0-9.]+)?$"


class ImageSpec(_Strict):
    dockerfile: str = Field(description="the Dockerfile's path from the repository root")
    base: str = Field(description="the base image (build arg), e.g. python:3.11-slim-bookworm")


class ImageOverride(_Strict):
    dockerfile: str | None = Field(default=None, description="a Dockerfile path for this cell")
    base: str | None = Field(default=None, description="a base image for this cell")


WORKERS = (
    'pytest-xdist workers: "auto" (one per core), a number, or 0 (no xdist: the tests run in '
    "the pytest process)"
)


def _workers(value: Any) -> int | str:
    """One error for both spellings (a union's would say each); YAML's 0 is a ScalarInt."""
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return int(value)
    raise ValueError('expected "auto" or a number, 0 or more')


Workers = Annotated[int | str, PlainValidator(_workers)]


class TestSelection(_Strict):
    paths: list[str] = Field(min_length=1, description="test paths, e.g. [tests/library]")
    markers: str = Field(min_length=1, description='a pytest -m expression, e.g. "not slow"')
    workers: Workers = Field(default=0, description=WORKERS)


class TestOverride(_Strict):
    paths: list[str] | None = Field(default=None, min_length=1, description="test paths")
    markers: str | None = Field(default=None, min_length=1, description="a pytest -m expression")
    workers: Workers | None = Field(default=None, description=WORKERS)


class Defaults(_Strict):
    python: PythonVersion
    image: ImageSpec
    tests: TestSelection
    runner: str = Field(description="a key of `runners`: where cells run on GitHub")
    selections: list[SelectionName] = Field(min_length=1, description="pr, main or both")


class VariantSpec(_Strict):
    index_url: str = Field(pattern=r"^(https?|file)://", description="an http(s) index URL")
    index_url_env: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$", description="a variable name")


class _CellFields(_Strict):  # what `CellSpec` (as written in the file) and `Cell` share
    name: CellName
    variant: VariantName = Field(description="the torch variant: cpu or cuda")
    torch: str = Field(pattern=TORCH_PATTERN, description='the torch version to pin, "2.13.0"')
    cuda: str | None = Field(default=None, pattern=r"^[0-9]+$", description='a CUDA major, "13"')
    gpu: bool = Field(default=False, description="true when the tests need a visible GPU")
    pypi: bool = Field(default=False, description="true for the cell whose wheel PyPI gets")


class CellSpec(_CellFields):  # as written in the file; `Cell`: with the defaults applied
    python: PythonVersion | None = None
    also_pythons: list[PythonVersion] = Field(
        default=[], description="other Pythons the cell's one (abi3) wheel is tested on"
    )
    runner: str | None = Field(default=None, description="a key of `runners`")
    selections: list[SelectionName] | None = Field(default=None, min_length=1)
    image: ImageOverride | None = None
    tests: TestOverride | None = None


class ProjectTests(_Strict):
    """What `nox -s tests` runs: one cell with the local runner, plus the tooling's own tests."""

    cell: CellName
    tooling_paths: list[str] = Field(min_length=1, description="test paths, e.g. [tests/matrix]")
    tooling_markers: str = Field(
        default="",
        description="pytest -m expression for the tooling tests `nox -s tests` runs (e.g. "
        "'not slow'); `nox -s tooling-tests` runs them all",
    )


class ModelsRun(_Strict):
    """What `nox -s models` runs: the model zoo's tests in one cell."""

    cell: CellName
    tests: TestSelection


class PublishLocal(_Strict):
    """What `nox -s publish-local` (the rehearsal of a release) tests after each install from
    its local index: the cells already tested the same wheel files."""

    tests: TestSelection


class MatrixFile(_Strict):
    version: Literal[1] = Field(description="the schema version of this file: 1")
    defaults: Defaults
    runners: dict[str, list[str]] = Field(min_length=1, description="named runner label sets")
    variants: dict[VariantName, VariantSpec] = Field(min_length=1, description="cpu and cuda")
    project_tests: ProjectTests
    models: ModelsRun | None = None
    publish_local: PublishLocal | None = None
    cells: list[CellSpec] = Field(min_length=1, description="the list of cells")


class LoadedMatrix(NamedTuple):
    """A validated matrix and the file it came from (its directory is the repository root)."""

    file: Path
    spec: MatrixFile

    @property
    def root(self) -> Path:
        return self.file.parent


def format_key_path(path: Iterable[str | int]) -> str:
    """("cells", 1, "torch") -> "cells[1].torch"."""
    parts = (f"[{part}]" if isinstance(part, int) else f".{part}" for part in path)
    return "".join(parts).removeprefix(".")


def find_matrix_file(start: Path) -> Path:
    for directory in (start.resolve(), *start.resolve().parents):
        if (directory / MATRIX_FILE_NAME).is_file():
            return directory / MATRIX_FILE_NAME
    message = f"no {MATRIX_FILE_NAME} here or above; run from the repository or pass --matrix PATH"
    raise MatrixFileError(start / MATRIX_FILE_NAME, [Problem("", message)])


def load_matrix(file: Path) -> LoadedMatrix:
    """Read and validate a matrix file; raise MatrixFileError listing every problem."""
    file = file.resolve()
    if not file.is_file():
        raise MatrixFileError(file, [Problem("", "file not found; pass --matrix PATH")])
    try:  # the round-trip loader keeps the line of every key and refuses repeated keys
        data = YAML().load(file.read_text(encoding="utf-8"))
    except MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        message = f"invalid YAML{column}: {error.problem or error.context or 'invalid YAML'}"
        raise MatrixFileError(file, [Problem("", message, line)]) from None
    except (YAMLError, OSError, UnicodeDecodeError) as error:
        raise MatrixFileError(file, [Problem("", f"cannot be read: {error}")]) from None
    except Exception as error:
        # Any failure of the parser is the file's problem: ruamel.yaml takes some
        # unquoted words for numbers it then cannot convert ("-_", "._"), and raises
        # from its constructor (IndexError, ValueError) with no position.
        message = (
            f"a value YAML cannot read ({type(error).__name__}: {error}); "
            "quote values that are not numbers"
        )
        raise MatrixFileError(file, [Problem("", message)]) from None

    def problem(loc: KeyPath, message: str) -> Problem:  # at the line of its nearest key
        node, line = data, None
        for key in loc:
            if isinstance(node, CommentedMap) and key in node:
                line = node.lc.key(key)[0] + 1
            elif isinstance(node, CommentedSeq) and isinstance(key, int) and key < len(node):
                line = node.lc.item(key)[0] + 1
            else:
                break
            node = node[key]
        return Problem(format_key_path(loc), message, line)

    if not isinstance(data, dict):
        kind = f"a {'list' if isinstance(data, list) else type(data).__name__}"
        kind = "empty" if data is None else kind
        raise MatrixFileError(file, [problem((), f"expected a mapping at the top, got {kind}")])
    try:
        spec = MatrixFile.model_validate(data)
    except ValidationError as error:
        located = [(tuple(p for p in e["loc"] if p != "[key]"), e) for e in error.errors()]
        problems = [problem(loc, _describe(e, loc)) for loc, e in located]
        raise MatrixFileError(file, problems) from None
    problems = [problem(loc, message) for loc, message in _reference_problems(spec)]
    if problems:
        raise MatrixFileError(file, problems)
    return LoadedMatrix(file=file, spec=spec)


def _describe(item: Any, loc: KeyPath) -> str:
    """A pydantic error in words, with the description of the field when the schema has one."""
    models = (MatrixFile, Defaults, ImageSpec, TestSelection, VariantSpec, CellSpec, ProjectTests)
    fields = {name: field for model in models for name, field in model.model_fields.items()}
    kind, value, key = item["type"], item.get("input"), str(loc[-1]) if loc else ""
    expected = fields[key].description if key in fields else None
    if kind == "missing":
        return f"missing key; expected {expected}" if expected else "missing key"
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown key {key!r}{hint} (the comments atop matrix.yaml list every key)"
    got = f"a list of {len(value)}" if isinstance(value, list) else f"{value!r}"
    got = "a mapping" if isinstance(value, dict) else got
    if kind == "string_type" and isinstance(value, int | float) and not isinstance(value, bool):
        return f"expected a string, got the number {value!r}: quote it (YAML reads 3.10 as 3.1)"
    if kind == "string_pattern_mismatch" and expected:
        return f"expected {expected}, got {got}"
    detail = item["msg"].removeprefix("Value error, ").replace("Input should be", "expected")
    if expected and kind not in ("too_short", "literal_error"):
        detail += f" ({expected})"
    return f"{detail}, got {got}"


def _reference_problems(spec: MatrixFile) -> Iterator[tuple[KeyPath, str]]:
    """What the schema cannot say: references between keys, and rules across cells."""
    runners, first, pypi_cells = sorted(spec.runners), dict[str, int](), dict[str, str]()
    if spec.defaults.runner not in runners:
        yield ("defaults", "runner"), f"unknown runner; expected one of {runners}"
    for index, cell in enumerate(spec.cells):
        at, python = ("cells", index), cell.python or spec.defaults.python
        if cell.name in first:
            used = f"first used by cells[{first[cell.name]}]"
            yield (*at, "name"), f"duplicate cell name {cell.name!r} ({used}); make it unique"
        first.setdefault(cell.name, index)
        if cell.variant not in spec.variants:
            known = f"{sorted(spec.variants)} (keys of `variants`)"
            yield (*at, "variant"), f"unknown variant {cell.variant!r}; expected one of {known}"
        if cell.variant == "cuda" and cell.cuda is None:
            yield (*at, "cuda"), 'missing key; a cuda cell must say its CUDA major, e.g. "13"'
        if cell.variant == "cpu" and cell.cuda is not None:
            yield (*at, "cuda"), "a cpu cell expects torch.version.cuda to be None; remove this key"
        if cell.gpu and cell.variant != "cuda":
            yield (*at, "gpu"), "gpu: true needs variant cuda; a CPU-only torch cannot use a GPU"
        if cell.pypi and cell.gpu:
            builds = "pypi: true marks a cell that builds the wheel PyPI gets"
            yield (*at, "pypi"), f"{builds}; set it on the build cell"
        elif cell.pypi and python in pypi_cells:
            first_pypi = f"first: {pypi_cells[python]}; PyPI takes one wheel per Python"
            yield (*at, "pypi"), f"a second pypi: true cell for Python {python} ({first_pypi})"
        elif cell.pypi:
            pypi_cells[python] = cell.name
        image = cell.image.base if cell.image and cell.image.base else spec.defaults.image.base
        for position, other in enumerate(cell.also_pythons):
            where = (*at, "also_pythons", position)
            if other == python or other in cell.also_pythons[:position]:
                yield where, f"Python {other} is listed twice (the cell's own Python is {python})"
            elif cell.gpu:
                yield where, "a gpu cell tests its build cell's wheel; list Pythons there"
            elif not PYTHON_IMAGE.match(image):
                yield where, f"needs a python:X.Y-... base image to derive from, not {image!r}"
        if cell.runner is not None and cell.runner not in runners:
            yield (*at, "runner"), f"unknown runner {cell.runner!r}; expected one of {runners}"
    if spec.project_tests.cell not in first:
        yield ("project_tests", "cell"), f"unknown cell; expected one of {sorted(first)}"
    if spec.models is not None and spec.models.cell not in first:
        yield ("models", "cell"), f"unknown cell; expected one of {sorted(first)}"


class IndexUrl(NamedTuple):
    """The index a cell's torch comes from, and which setting chose it."""

    url: str
    source: str


class Cell(_CellFields):
    python: str
    also_pythons: tuple[str, ...] = ()  # Python rows: the wheel tested on these too
    index: IndexUrl
    image: ImageSpec
    tests: TestSelection
    runner_labels: tuple[str, ...]  # the labels of its runner (matrix.yaml `runners`)
    selections: tuple[SelectionName, ...]

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch}"


def parse_index_override(text: str) -> tuple[VariantName, str]:
    """'cpu=https://...' -> ("cpu", "https://..."), as given to --index-url."""
    variant, _, url = text.partition("=")
    if variant in get_args(VariantName) and url:
        return cast(VariantName, variant), url
    raise MatrixError(
        f"--index-url {text!r}: expected VARIANT=URL with VARIANT cpu or cuda, "
        "e.g. --index-url cpu=https://download.pytorch.org/whl/cpu"
    )


def expand_cells(
    spec: MatrixFile,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[VariantName, str] | None = None,  # --index-url's, per variant
) -> tuple[Cell, ...]:
    """All cells of ``spec``, defaults applied."""
    defaults, environ, overrides, cells = spec.defaults, environ or {}, overrides or {}, []
    for cell in spec.cells:
        variant, settings = cell.variant, spec.variants[cell.variant]
        if variant in overrides:
            index = IndexUrl(overrides[variant], f"--index-url {variant}=...")
        elif url := environ.get(settings.index_url_env, "").strip():
            index = IndexUrl(url, f"${settings.index_url_env}")
        else:
            index = IndexUrl(settings.index_url, f"matrix.yaml variants.{variant}.index_url")
        image, tests = (cell.image or ImageOverride(), cell.tests or TestOverride())
        cells.append(
            Cell(
                **cell.model_dump(include=set(_CellFields.model_fields)),
                python=cell.python or defaults.python,
                also_pythons=tuple(cell.also_pythons),
                index=index,
                image=defaults.image.model_copy(update=image.model_dump(exclude_none=True)),
                tests=defaults.tests.model_copy(update=tests.model_dump(exclude_none=True)),
                runner_labels=tuple(spec.runners[cell.runner or defaults.runner]),
                selections=tuple(cell.selections or defaults.selections),
            )
        )
    return tuple(cells)


def on_python(cell: Cell, python: str) -> Cell:
    """``cell`` on another Python: its base image python:X.Y-... becomes python:<python>-...;
    the same torch, tests and runner."""
    base = PYTHON_IMAGE.sub(f"python:{python}", cell.image.base)
    image = cell.image.model_copy(update={"base": base})
    return cell.model_copy(update={"python": python, "image": image, "also_pythons": ()})


def pick_cells(cells: Iterable[Cell], names: Iterable[str]) -> tuple[Cell, ...]:
    by_name = {cell.name: cell for cell in cells}
    wanted = list(dict.fromkeys(names))
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise MatrixError(
            f"unknown cell(s): {', '.join(unknown)}. Cells in matrix.yaml: {', '.join(by_name)} "
            "(python -m fallback_matrix list shows them)."
        )
    return tuple(by_name[name] for name in wanted)
