"""Releases: the commands ``dist`` (the PyPI cells' wheels, checked, and the sdist into dist/)
and ``publish-local`` (a dress rehearsal of the upload: twine to a local index, then cells that
install torch-fallback from it)."""

import os
import shutil
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import make_server

from packaging.utils import parse_wheel_filename

from .cache import cache_root
from .errors import EXIT_OK, MatrixError
from .matrix import Cell, MatrixFile, pick_cells
from .report import Reporter, run_process
from .workflows import both, wheel_tests

if TYPE_CHECKING:  # cli imports this module for its command table
    from .cli import Context


def find_wheel(path: Path, what: str = "--wheel") -> Path:
    """``path`` if it is a wheel, else the one torch_fallback wheel in the directory ``path``."""
    if path.is_file() and path.suffix == ".whl":
        return path
    wheels = sorted(path.glob("torch_fallback-*.whl")) if path.is_dir() else []
    if len(wheels) != 1:
        raise MatrixError(
            f"{what} {path}: expected one torch_fallback-*.whl, found "
            f"{', '.join(w.name for w in wheels) or 'none'}; build one first (nox -s "
            f"build-{path.name} puts it in artifacts/{path.name}/) or name the wheel file"
        )
    return wheels[0]


def collect_dist(artifacts: Path, cells: Sequence[Cell], out: Path, tag: str | None) -> list[Path]:
    """Copy the PyPI cells' wheels to ``out`` after checking what PyPI and users need."""
    problems, wheels = [], []
    for cell in cells:
        if not cell.pypi:
            problems.append(f"cell {cell.name} is not marked pypi: true in matrix.yaml")
            continue
        wheel = find_wheel(artifacts / cell.name, "artifacts of cell")
        _, version, _, tags = parse_wheel_filename(wheel.name)
        if version.local is not None:
            problems.append(f"{wheel.name}: local version label +{version.local} (PyPI rejects it)")
        if tag and str(version) != tag.removeprefix("v"):
            problems.append(f"{wheel.name}: version {version} is not the tag's {tag}")
        if not all(t.platform.startswith("manylinux") for t in tags):
            problems.append(f"{wheel.name}: not a manylinux wheel (auditwheel repair it)")
        wheels.append(wheel)
    if problems:
        raise MatrixError("not publishing: " + "; ".join(problems))
    out.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(wheel, out / wheel.name)) for wheel in wheels]


def build_sdist(root: Path, out: Path, log: Reporter) -> Path:
    """The source distribution (python -m build --sdist): it needs no torch; a wheel built
    from it without torch stops at once with what to do (setup.py)."""
    before = set(out.glob("torch_fallback-*.tar.gz"))
    command = [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(root)]
    if run_process(command, log.line):
        raise MatrixError("python -m build --sdist failed; see above")
    (sdist,) = set(out.glob("torch_fallback-*.tar.gz")) - before or set(out.glob("*.tar.gz"))
    return sdist


@contextmanager
def local_index(directory: Path, log: Reporter) -> Iterator[str]:
    """A pypiserver in this process serving ``directory`` on 127.0.0.1, no password: its URL."""
    import pypiserver  # only this command needs it

    directory.mkdir(parents=True, exist_ok=True)
    options = {"authenticate": [], "password_file": ".", "disable_fallback": True}
    server = make_server("127.0.0.1", 0, pypiserver.app(roots=[str(directory)], **options))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    log.say(f"local index: pypiserver {pypiserver.__version__} serving {directory} at {url}/")
    try:
        yield url
    finally:
        server.shutdown()


def install_target(c: "Context", name: str) -> tuple[Cell, Cell]:
    """(the cell to install into, the build cell whose wheel it takes) for a cell of the
    matrix or a wheel test (a Python row: the wheel of its cell on another Python)."""
    tests = {test.name: test for test in wheel_tests(c.cells)}
    if name in tests:  # named after the test: its results must not pass for the cell's
        return tests[name].target.model_copy(update={"name": name}), tests[name].source
    cell = c.cell(name)
    return cell, cell


def rehearsal_cell(spec: MatrixFile, cell: Cell) -> Cell:
    """``cell`` as publish-local installs into it (CELL-from-index), with matrix.yaml's
    publish_local tests, those of them the cell selects (not the GPU tests of a cell
    without a GPU); without that section, the cell's own tests."""
    update: dict[str, Any] = {"name": f"{cell.name}-from-index"}
    if spec.publish_local is not None:
        tests = spec.publish_local.tests
        markers = both(cell.tests.markers, tests.markers)
        update["tests"] = tests.model_copy(update={"markers": markers})
    return cell.model_copy(update=update)


def cmd_dist(c: "Context") -> int:
    tag = c.args.tag or os.environ.get("GITHUB_REF_NAME") or ""
    tag = tag if tag.startswith("v") else None  # a branch is no version to check against
    out = Path(c.args.out).resolve()
    for wheel in collect_dist(c.artifacts, pick_cells(c.cells, c.args.cells), out, tag):
        c.reporter.say(f"{wheel.name} -> {out}")
    sdist = build_sdist(c.matrix.root, out, c.reporter)
    version = sdist.name.removeprefix("torch_fallback-").removesuffix(".tar.gz")
    if tag and version != tag.removeprefix("v"):
        raise MatrixError(f"not publishing: {sdist.name}: version {version} is not the tag's {tag}")
    c.reporter.say(f"{sdist.name} -> {out}")
    return EXIT_OK


def cmd_publish_local(c: "Context") -> int:
    wheels = sorted({w.name: w for w in c.artifacts.glob("*/torch_fallback-*.whl")}.values())
    if not wheels:
        raise MatrixError(f"no wheels under {c.artifacts}; build cells first (nox -s build-cpu)")
    targets = [install_target(c, name) for name in dict.fromkeys(c.args.cell or ["cpu"])]
    packages = cache_root() / "local-index"
    shutil.rmtree(packages, ignore_errors=True)
    status = EXIT_OK
    with (
        c.reporter.for_cell("publish", c.artifacts / "publish-local" / "publish.log") as log,
        local_index(packages, log) as url,
    ):
        sdist = build_sdist(c.matrix.root, packages.parent / "sdist", log)
        log.say(f"twine upload of {len(wheels)} wheel(s) and {sdist.name} to {url}/")
        twine = [sys.executable, "-m", "twine", "upload", "--non-interactive", "-u", "ci"]
        upload = [*twine, "-p", "ci", "--repository-url", f"{url}/", *map(str, wheels), str(sdist)]
        if run_process(upload, log.line):
            raise MatrixError(f"twine upload to {url} failed; see above")
        log.say(f"local index now serves: {', '.join(sorted(p.name for p in packages.iterdir()))}")
        for cell, source in targets:
            version = parse_wheel_filename(find_wheel(c.artifacts / source.name).name)[1]
            into = rehearsal_cell(c.matrix.spec, cell)
            title = f"installed from the local index (Python {cell.python})"
            status |= c.run(
                [into],
                title,
                index_url=f"{url}/simple/",
                requirement=f"torch-fallback=={version}",
            )
    return status
