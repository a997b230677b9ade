# /// script
# requires-python = ">=3.11"
# dependencies = [
#   "nox>=2025.2.9", "fallback-matrix @ file:./src/fallback_matrix", "pytest>=8", "hypothesis>=6",
#   "pyyaml>=6", "pypiserver>=2", "twine>=5", "build>=1.2",
# ]
# ///
"""nox sessions of torch-fallback: thin wrappers over fallback_matrix.

`pip install nox` is all the set-up needed: nox reads the block above and
installs what this file imports (--script-mode), fallback_matrix itself included
(from src/fallback_matrix, reinstalled at every start; run nox from the
repository root). Sessions `build-<cell>` come
from matrix.yaml, so a new cell needs no edit here. Arguments after `--` go to
fallback_matrix, e.g. `nox -s build-cpu -- --runner local`.

`nox` alone runs `tests`. Tags group sessions, `nox -t TAG` runs a group: build (every
cell's build), pr and main (the builds of the cells CI runs on a pull request, on main),
wheel-test (the wheel tests derived from the cells), checks (the checks workflow's).
Sessions that are not default take arguments or are run now and then.
"""

from __future__ import annotations

from pathlib import Path

import nox

from fallback_matrix import cli
from fallback_matrix.matrix import Cell, expand_cells, find_matrix_file, load_matrix
from fallback_matrix.workflows import WheelTest, wheel_tests

ROOT = Path(__file__).resolve().parent

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]


def _call(session: nox.Session, *args: str) -> None:
    status = cli.main([*args, *session.posargs])
    if status != 0:
        session.error(f"python -m fallback_matrix {' '.join(args)} exited with status {status}")


def _build_session(cell: Cell) -> None:
    def build(session: nox.Session) -> None:
        _call(session, "run", cell.name, "--runner", "auto")

    build.__doc__ = (
        f"Build and test matrix cell {cell.name!r} as CI does (Docker when a daemon answers; "
        "-- --runner local|docker|auto)."
    )
    # a cell that pull requests do not build (a main-only one) is no default session either
    default, tags = "pr" in cell.selections, ["build", *cell.selections]
    nox.session(name=f"build-{cell.name}", python=False, default=default, tags=tags)(build)


def _wheel_test_session(test: WheelTest) -> None:
    def run_wheel_test(session: nox.Session) -> None:
        _call(session, "cross", test.name)

    run_wheel_test.__doc__ = (
        f"The {test.title} (nox -s build-{test.source.name} first): torch {test.target.torch}, "
        f"Python {test.target.python}."
    )
    nox.session(name=test.name, python=False, default=False, tags=["wheel-test"])(run_wheel_test)


_CELLS = expand_cells(load_matrix(find_matrix_file(ROOT)).spec)
for _cell in _CELLS:
    _build_session(_cell)
for _test in wheel_tests(_CELLS):
    _wheel_test_session(_test)


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """The test suite: tooling tests, then the extension built and tested as the cpu cell."""
    _call(session, "project-tests")


@nox.session(python=False, default=False)
def models(session: nox.Session) -> None:
    """The model zoo (tests/models) in matrix.yaml's `models` cell, every model (-- --runner)."""
    _call(session, "models")


@nox.session(python=False, default=False)
def reproduce(session: nox.Session) -> None:
    """Run exactly one cell as CI runs it: nox -s reproduce -- CELL [--gpus]."""
    if not session.posargs:
        session.error(
            "name the cell: nox -s reproduce -- CELL (python -m fallback_matrix list shows them)"
        )
    status = cli.main(["reproduce", *session.posargs])
    if status != 0:
        session.error(f"reproducing {session.posargs[0]} failed (exit status {status})")


@nox.session(python=False, default=False)
def summary(session: nox.Session) -> None:
    """Table of the last results under artifacts/ (and markdown in $GITHUB_STEP_SUMMARY)."""
    _call(session, "summary")


@nox.session(name="test-wheel", python=False, default=False)
def test_wheel(session: nox.Session) -> None:
    """Test a wheel built elsewhere in a cell: nox -s test-wheel -- CELL --wheel DIR [--gpus]."""
    _call(session, "test-wheel")


@nox.session(name="tooling-tests", python=False, tags=["checks"])
def tooling_tests(session: nox.Session) -> None:
    """The tooling's own tests (tests/matrix), as the checks workflow runs them."""
    _call(session, "tooling-tests")


@nox.session(python=False, default=False)
def dist(session: nox.Session) -> None:
    """Collect and check the PyPI cells' wheels into dist/: nox -s dist -- CELL... [--tag vX]."""
    _call(session, "dist")


@nox.session(python=False, default=False)
def clean(session: nox.Session) -> None:
    """Remove leftover containers (-- --caches: also images, volumes, caches, this run's dir)."""
    _call(session, "clean")


@nox.session(name="publish-local", python=False, default=False)
def publish_local(session: nox.Session) -> None:
    """twine upload the built wheels and the sdist to a local pypiserver; fresh containers
    install from it on two Pythons: cpu's wheel on 3.11, the one abi3 wheel of cuda on 3.12
    (-- --cell NAME ... picks others)."""
    cells = [] if "--cell" in session.posargs else ["--cell", "cpu", "--cell", "cuda-on-py312"]
    _call(session, "publish-local", *cells)


@nox.session(python=False, default=False, tags=["checks"])
def workflows(session: nox.Session) -> None:
    """Generate .github/workflows from matrix.yaml (-- --check: only compare)."""
    _call(session, "workflows")


@nox.session(tags=["checks"])
def lint(session: nox.Session) -> None:
    """The hooks of .pre-commit-config.yaml on every file: ruff, mypy --strict, hadolint,
    check-jsonschema, zizmor, actionlint."""
    session.install("pre-commit>=4")
    session.run("pre-commit", "run", "--all-files", "--show-diff-on-failure", *session.posargs)
