"""Every error meant for the user lives in fallback_matrix.errors, with its exit code."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from fallback_matrix import errors
from fallback_matrix.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    CapError,
    CellError,
    DockerUnavailableError,
    GpuUnavailableError,
    MatrixError,
    MatrixFileError,
    Problem,
    StepFailed,
)

EXIT_CODES = {
    MatrixError: EXIT_USAGE,
    MatrixFileError: EXIT_USAGE,
    CapError: EXIT_USAGE,
    DockerUnavailableError: EXIT_USAGE,
    GpuUnavailableError: EXIT_USAGE,
    CellError: EXIT_FAILED,
    StepFailed: EXIT_FAILED,
}


def test_the_exit_codes() -> None:
    assert (EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED) == (0, 1, 2, 130)


def test_every_error_class_has_its_exit_code_and_says_when_it_is_raised() -> None:
    defined = {
        value
        for value in vars(errors).values()
        if inspect.isclass(value) and issubclass(value, BaseException)
    }
    assert defined == set(EXIT_CODES)
    for error, code in EXIT_CODES.items():
        assert issubclass(error, MatrixError), error  # main reports it, no traceback
        assert "exit_code" in vars(error) and error.exit_code == code, error  # its own
        assert vars(error).get("__doc__"), f"{error.__name__}: say when it is raised"


@pytest.mark.parametrize("error", list(EXIT_CODES))
def test_an_error_keeps_its_message(error: type[MatrixError]) -> None:
    if error is MatrixFileError:
        raised = MatrixFileError(Path("matrix.yaml"), [Problem("cells[0].torch", "bad", 3)])
        assert "matrix.yaml:3: cells[0].torch: bad" in str(raised)
        assert raised.problems == (Problem("cells[0].torch", "bad", 3),)
    else:
        assert str(error("what to do")) == "what to do"


def test_no_other_module_defines_an_error() -> None:
    package = Path(errors.__file__).parent
    for module in sorted(package.glob("*.py")):
        if module.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(base) for base in node.bases}
                assert not any(base.endswith(("Error", "Exception")) for base in bases), (
                    f"{module.name}: class {node.name} belongs in errors.py"
                )
