"""Load matrix.yaml into a validated `MatrixFile`, or explain precisely what is wrong.

Every problem names the file, the line (when known), the key path in the
`cells[1].torch` style and what was expected. Malformed YAML, wrong types,
missing or unknown keys and broken cross-references all end up as one
`MatrixFileError`; no traceback reaches the user.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from .errors import MatrixFileError, Problem
from .model import MatrixFile
from .yaml_source import KeyPath, YamlDocument, YamlSyntaxError, read_yaml

MATRIX_FILE_NAME = "matrix.yaml"


@dataclass(frozen=True)
class LoadedMatrix:
    """A validated matrix and the file it came from."""

    file: Path
    spec: MatrixFile

    @property
    def root(self) -> Path:
        """The repository root: the directory holding matrix.yaml."""
        return self.file.parent


def format_key_path(path: Iterable[str | int]) -> str:
    """("cells", 1, "torch") -> "cells[1].torch"."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def find_matrix_file(start: Path) -> Path:
    """The matrix.yaml in ``start`` or its nearest ancestor."""
    start = start.resolve()
    for directory in (start, *start.parents):
        candidate = directory / MATRIX_FILE_NAME
        if candidate.is_file():
            return candidate
    raise MatrixFileError(
        start / MATRIX_FILE_NAME,
        [
            Problem(
                "",
                f"no {MATRIX_FILE_NAME} here or in any parent directory; run from the "
                "repository root or pass --matrix PATH",
            )
        ],
    )


def load_matrix(file: Path) -> LoadedMatrix:
    """Read and validate a matrix file; raise MatrixFileError listing every problem."""
    file = file.resolve()
    if not file.is_file():
        raise MatrixFileError(
            file, [Problem("", "file not found; pass --matrix PATH to use another")]
        )
    try:
        document = read_yaml(file)
    except YamlSyntaxError as error:
        raise MatrixFileError(file, [Problem("", str(error), error.line)]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise MatrixFileError(file, [Problem("", f"cannot be read: {error}")]) from None
    if not isinstance(document.data, dict):
        kind = "empty" if document.data is None else f"a {type(document.data).__name__}"
        raise MatrixFileError(
            file,
            [
                Problem(
                    "",
                    f"expected a mapping with keys version, defaults, ... at the top, got {kind}",
                    1,
                )
            ],
        )
    try:
        spec = MatrixFile.model_validate(document.data)
    except ValidationError as error:
        raise MatrixFileError(file, list(_schema_problems(error, document))) from None
    problems = list(_reference_problems(spec, document))
    if problems:
        raise MatrixFileError(file, problems)
    return LoadedMatrix(file=file, spec=spec)


# --- schema errors -------------------------------------------------------------------------------


def _schema_problems(error: ValidationError, document: YamlDocument) -> Iterator[Problem]:
    for item in error.errors(include_url=False):
        loc = tuple(part for part in item["loc"] if part != "[key]")
        yield Problem(
            key_path=format_key_path(loc),
            message=_describe(item, loc),
            line=document.line_of(loc),
        )


def _describe(item: Any, loc: KeyPath) -> str:
    kind = item["type"]
    value = item.get("input")
    field = _field_at(MatrixFile, loc)
    expected = field.description if field is not None and field.description else None
    if kind == "missing":
        return f"missing key; expected {expected}" if expected else "missing key"
    if kind == "extra_forbidden":
        return _unknown_key_message(loc)
    got = _show(value)
    if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"expected a string, got the number {value!r}: quote it (YAML reads 3.10 as 3.1)" + (
            f"; expected {expected}" if expected else ""
        )
    if kind == "string_pattern_mismatch" and expected:
        return f"expected {expected}, got {got}"
    if kind == "literal_error":
        return f"{item['msg'].replace('Input should be', 'expected')}, got {got}"
    detail = item["msg"].replace("Input should be", "expected")
    if expected and kind != "too_short":
        detail += f" ({expected})"
    return f"{detail}, got {got}"


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"{value!r} ({type(value).__name__})"


def _unknown_key_message(loc: KeyPath) -> str:
    name = str(loc[-1])
    parent = _model_at(MatrixFile, loc[:-1])
    if parent is None:
        return f"unknown key {name!r}"
    allowed = list(parent.model_fields)
    close = difflib.get_close_matches(name, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key {name!r}; allowed here: {', '.join(allowed)}{hint}"


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _walk(model: type[BaseModel], loc: KeyPath) -> tuple[Any, FieldInfo | None]:
    annotation: Any = model
    field: FieldInfo | None = None
    for part in loc:
        annotation = _unwrap(annotation)
        origin = get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            if field is None:
                return None, None
            annotation = field.annotation
        elif origin is list and isinstance(part, int):
            annotation = get_args(annotation)[0]
        elif origin is dict:
            annotation = get_args(annotation)[1]
        else:
            return None, None
    return _unwrap(annotation), field


def _field_at(model: type[BaseModel], loc: KeyPath) -> FieldInfo | None:
    return _walk(model, loc)[1]


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    annotation = _walk(model, loc)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


# --- cross-references the schema cannot express ---------------------------------------------------


def _reference_problems(spec: MatrixFile, document: YamlDocument) -> Iterator[Problem]:
    def problem(loc: KeyPath, message: str) -> Problem:
        return Problem(format_key_path(loc), message, document.line_of(loc))

    runners = sorted(spec.runners)
    if spec.defaults.runner not in spec.runners:
        yield problem(
            ("defaults", "runner"),
            f"unknown runner {spec.defaults.runner!r}; "
            f"expected one of {runners} (keys of `runners`)",
        )
    first_index: dict[str, int] = {}
    pypi_pythons: dict[str, str] = {}
    for index, cell in enumerate(spec.cells):
        here: KeyPath = ("cells", index)
        if cell.name in first_index:
            yield problem(
                (*here, "name"),
                f"duplicate cell name {cell.name!r} "
                f"(first used by cells[{first_index[cell.name]}]); "
                "cell names must be unique",
            )
        else:
            first_index[cell.name] = index
        if cell.variant not in spec.variants:
            yield problem(
                (*here, "variant"),
                f"unknown variant {cell.variant!r}; expected one of {sorted(spec.variants)} "
                "(keys of `variants`)",
            )
        if cell.variant == "cuda" and cell.cuda is None:
            yield problem(
                (*here, "cuda"),
                "missing key; a cuda cell must say which CUDA major torch.version.cuda has, "
                'e.g. "13"',
            )
        if cell.variant == "cpu" and cell.cuda is not None:
            yield problem(
                (*here, "cuda"), "a cpu cell expects torch.version.cuda to be None; remove this key"
            )
        if cell.gpu and cell.variant != "cuda":
            yield problem(
                (*here, "gpu"), "gpu: true needs variant cuda; a CPU-only torch cannot use a GPU"
            )
        if cell.pypi and cell.gpu:
            yield problem(
                (*here, "pypi"),
                "pypi: true marks a cell that builds the wheel PyPI gets; a gpu cell only tests "
                "another cell's wheel: set it on that build cell",
            )
        python = cell.python or spec.defaults.python
        if cell.pypi and python in pypi_pythons:
            yield problem(
                (*here, "pypi"),
                f"a second pypi: true cell for Python {python} (first: "
                f"{pypi_pythons[python]}); PyPI takes one wheel per Python and platform",
            )
        elif cell.pypi:
            pypi_pythons[python] = cell.name
        if cell.runner is not None and cell.runner not in spec.runners:
            yield problem(
                (*here, "runner"),
                f"unknown runner {cell.runner!r}; expected one of {runners} (keys of `runners`)",
            )
    if spec.project_tests.cell not in first_index:
        yield problem(
            ("project_tests", "cell"),
            f"unknown cell {spec.project_tests.cell!r}; expected one of {sorted(first_index)}",
        )
