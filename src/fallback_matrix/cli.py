"""python -m fallback_matrix: list, run, reproduce and summarize matrix cells; releases.

Exit status: 0 all passed, 1 a cell or test failed, 2 a wrong request (bad matrix, unknown cell).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from wsgiref.simple_server import make_server

from packaging.utils import parse_wheel_filename
from rich.table import Table
from ruamel.yaml import YAML

from . import cache, matrix, runners, summary
from .job import Job, pytest_command
from .matrix import Cell, CellError, LoadedMatrix, MatrixError, pick_cells
from .report import JUNIT_FILE, LOG_FILE, RESULT_FILE, Reporter, run_process
from .runners import Runner
from .wheelhouse import ensure_wheelhouse, wheelhouse_path
from .workflows import REGENERATE_COMMAND, check_workflows, plan_workflows, wheel_tests

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TOOLING_ROW = "tooling"
CACHE_ENV = "FALLBACK_MATRIX_CACHE"
# Why a job ended with this status, where the status itself says so.
EXIT_REASONS = {
    137: ": killed by SIGKILL (docker kill, out of memory)",
    143: ": stopped by SIGTERM (docker stop)",
}


def cache_root(repo: Path) -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).resolve() if configured else repo / ".cache" / "fallback-matrix"


def source_files(repo: Path) -> list[str]:
    """The files a build needs: git's tracked and untracked-but-not-ignored files."""
    git = ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        names = subprocess.run(git, capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        message = "git ls-files failed there: a build takes the files git tracks; clone the repo"
        raise MatrixError(f"{repo} is not a git checkout ({message})") from None
    return sorted(name for name in set(names) if name and (repo / name).is_file())


def make_job(matrix: LoadedMatrix, cell: Cell, cache: Path, artifacts: Path, **options: Any) -> Job:
    """The job of ``cell`` with host paths (the Docker runner maps them into its container)."""
    local, tests, image = cache / "local", cell.tests, cell.image
    return Job(
        cell=cell.name,
        **cell.model_dump(include={"python", "torch", "cuda", "gpu", "pypi"}),
        test_paths=list(tests.paths),
        test_markers=tests.markers,
        sources=source_files(matrix.root),
        repo=str(matrix.root),
        cache=str(local),
        work=str(local / "work" / cell.name),
        artifacts=str(artifacts),
        dockerfile=image.dockerfile,
        base_image=image.base,
        **options,
    )


def cache_cap(option: str | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """The cap in bytes of each cache store: --cache-cap, else $FALLBACK_MATRIX_CACHE_CAP, else
    the default; None: off."""
    text = option or environ.get(cache.CAP_ENV) or cache.DEFAULT_CAP
    try:
        return cache.parse_cap(text)
    except cache.CapError as error:
        raise MatrixError(str(error)) from None


def prune_wheelhouses(wheelhouse: Path, cap: int | None, log: Reporter) -> None:
    """Keep the wheelhouses under ``cap``, least recently used pruned first, ``wheelhouse``
    (this cell's) kept. A problem here is reported, never a failed cell."""
    if cap is None:
        log.say("cache cap off: wheelhouses are not pruned")
        return
    try:
        pruned = cache.prune(wheelhouse.parent, cap, keep=[wheelhouse], what="wheelhouses")
    except OSError as error:
        log.say(f"warning: pruning the wheelhouses in {wheelhouse.parent} failed: {error}")
        return
    for line in pruned.lines():
        log.say(line)


def run_cell(
    matrix: LoadedMatrix, cell: Cell, runner: Runner, out: Path, reporter: Reporter, **options: Any
) -> dict[str, Any]:
    """Run one cell, its result (cell.log, result.json, the job's artifacts) in ``out``;
    ``options``: Job fields (``cache_cap`` also bounds the wheelhouses). A failure ends up in
    result.json's record, returned, never raised."""
    shutil.rmtree(out, ignore_errors=True)
    started, error, exit_code, where = time.monotonic(), None, 1, runner.name
    with reporter.for_cell(cell.name, out / LOG_FILE) as log:
        tests = f"tests {' '.join(cell.tests.paths)} -m {cell.tests.markers!r}"
        index = f"index {cell.index.url} ({cell.index.source})"
        log.say(f"torch=={cell.torch} ({cell.variant}), Python {cell.python}, {tests}, {index}")
        try:
            root, pyproject = cache_root(matrix.root), matrix.root / "pyproject.toml"
            with cache.in_use(wheelhouse_path(cell, pyproject, root)):
                wheelhouse = ensure_wheelhouse(cell, pyproject, root, log)
                prune_wheelhouses(wheelhouse, options.get("cache_cap"), log)
                job = make_job(matrix, cell, root, out, wheelhouse=str(wheelhouse), **options)
                exit_code, where = runner.run(job, log)
            if exit_code != 0:
                status = f"exit status {exit_code}{EXIT_REASONS.get(exit_code, '')}"
                error = f"cell {cell.name} failed in {where} ({status}); log: {log.path}"
        except CellError as problem:
            error = str(problem) if cell.name in str(problem) else f"cell {cell.name}: {problem}"
            log.line(f"error: {error}")
    seconds = round(time.monotonic() - started, 1)
    record = summary.read_json(out / RESULT_FILE)  # the job's steps, when it ran
    record |= {"cell": cell.name, "runner": runner.name, "where": where, "exit_code": exit_code}
    record |= {"seconds": seconds, "error": error or record.get("error")}
    (out / RESULT_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


def run_tooling_tests(
    matrix: LoadedMatrix, artifacts: Path, reporter: Reporter, markers: str = ""
) -> None:
    """The tooling's own tests on the host (those ``markers`` selects), recorded like a cell
    named 'tooling'."""
    target = artifacts / TOOLING_ROW
    shutil.rmtree(target, ignore_errors=True)
    paths = matrix.spec.project_tests.tooling_paths
    reporter.rule(f"tooling tests: {' '.join(paths)}" + (f" (-m {markers!r})" if markers else ""))
    tests = [matrix.root / path for path in paths]
    command = pytest_command([sys.executable], tests, matrix.root, target / JUNIT_FILE, TOOLING_ROW)
    if markers:
        command += ["-m", markers]
    status = subprocess.call(command, cwd=matrix.root)
    record = {"cell": TOOLING_ROW, "runner": "host", "exit_code": status}
    record["error"] = f"tooling tests failed; see above ({target})" if status else None
    (target / RESULT_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")


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


class Context:
    def __init__(self, args: argparse.Namespace, reporter: Reporter) -> None:
        self.args, self.reporter = args, reporter
        file = Path(args.matrix) if args.matrix else matrix.find_matrix_file(Path.cwd())
        self.matrix = matrix.load_matrix(file)
        overrides = dict(matrix.parse_index_override(text) for text in args.index_url or [])
        self.cells = matrix.expand_cells(self.matrix.spec, environ=os.environ, overrides=overrides)
        self.artifacts = Path(args.artifacts or self.matrix.root / "artifacts").resolve()

    def cell(self, name: str, results_name: str | None = None) -> Cell:
        (cell,) = pick_cells(self.cells, [name])
        return cell.model_copy(update={"name": results_name or name})

    def run(
        self, cells: Sequence[Cell], title: str, names: Sequence[str] = (), **options: Any
    ) -> int:
        """Run ``cells`` (``options``: Job fields), then publish them (or ``names``)."""
        runner, reason = runners.choose_runner(self.args.runner)
        self.reporter.say(f"runner {runner.name} ({reason})")
        options = {"gpus": self.args.gpus, "cache_cap": cache_cap(self.args.cache_cap), **options}
        for number, cell in enumerate(cells, start=1):
            self.reporter.rule(f"cell {cell.name} ({number}/{len(cells)}) - runner {runner.name}")
            out = self.artifacts / cell.name
            result = run_cell(self.matrix, cell, runner, out, self.reporter, **options)
            state = "passed" if result["exit_code"] == 0 else "FAILED"
            self.reporter.say(f"{cell.name} {state} in {result['seconds']:.0f}s (log in {out}/)")
        return self.publish(names or [cell.name for cell in cells], title)

    def publish(self, names: Sequence[str] | None, title: str) -> int:
        """The summary table (also markdown for GitHub), a closing line, why cells failed."""
        rows = summary.collect_rows(self.artifacts, names)
        if not rows:
            raise MatrixError(f"no cell results under {self.artifacts}; run cells first")
        steps = summary.collect_step_times(self.artifacts, names)
        self.reporter.table(summary.render_table(rows, title=title))
        if steps:
            self.reporter.table(summary.render_step_table(steps, title=f"{title}: step times"))
        if target := os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(target, "a", encoding="utf-8") as handle:
                handle.write(summary.render_markdown(rows, title=title))
                if steps:
                    markdown = summary.render_step_markdown(steps, title=f"{title}: step times")
                    handle.write("\n" + markdown)
        self.reporter.line(summary.closing_line(rows, label=title))
        for row in rows:  # every failed cell's result says why
            if error := summary.read_json(self.artifacts / row.cell / RESULT_FILE).get("error"):
                self.reporter.error(error)
        return EXIT_FAILED if any(row.result != "passed" for row in rows) else EXIT_OK


def cmd_list(c: Context) -> int:
    headers = ("cell", "variant", "python", "torch", "cuda", "gpu", "runs on", "workflows", "tests")
    table = Table(*headers, title=f"cells of {c.matrix.file.name}")
    for cell in c.cells:
        tests = f"{' '.join(cell.tests.paths)} -m '{cell.tests.markers}'"
        labels, selections = ", ".join(cell.runner_labels), ", ".join(cell.selections)
        row = [cell.name, cell.variant, cell.python, cell.torch, cell.cuda or "-"]
        table.add_row(*row, "yes" if cell.gpu else "-", labels, selections, tests)
    c.reporter.table(table)
    for variant, index in sorted({(cell.variant, cell.index) for cell in c.cells}):
        c.reporter.line(f"index {variant}: {index.url}  ({index.source})")
    for test in wheel_tests(c.cells):
        c.reporter.line(f"wheel test {test.name}: {test.title}, -m '{test.cell.tests.markers}'")
    return EXIT_OK


def cmd_run(c: Context) -> int:
    return c.run(pick_cells(c.cells, c.args.cells), "matrix")


def cmd_reproduce(c: Context) -> int:
    cell = c.cell(c.args.cell)
    c.reporter.rule(f"reproducing cell {cell.name} as CI runs it (nox -s build-{cell.name})")
    return c.run([cell], "matrix")


def cmd_summary(c: Context) -> int:
    return c.publish(None, "matrix")


def cmd_project_tests(c: Context) -> int:
    selected = c.matrix.spec.project_tests.tooling_markers
    run_tooling_tests(c.matrix, c.artifacts, c.reporter, selected)
    cell = c.cell(c.matrix.spec.project_tests.cell)
    return c.run([cell], "tests", [TOOLING_ROW, cell.name])  # failed if either did


def cmd_models(c: Context) -> int:
    models = c.matrix.spec.models
    if models is None:
        raise MatrixError(
            "matrix.yaml has no `models` section: add one naming the cell and the zoo's tests, "
            "e.g. models: {cell: cpu, tests: {paths: [tests/models], markers: not requires_cuda}}"
        )
    cell = c.cell(models.cell).model_copy(update={"tests": models.tests})
    return c.run([cell], "models")


def cmd_tooling_tests(c: Context) -> int:
    run_tooling_tests(c.matrix, c.artifacts, c.reporter)
    return c.publish([TOOLING_ROW], "tooling")


def run_wheel_tests(c: Context, cell: Cell, wheel_path: Path, of: str) -> int:
    """Test the wheel at ``wheel_path`` (or the one in that directory) in ``cell``, a cell of
    the matrix (``of``) whose results may be named otherwise."""
    found = find_wheel(wheel_path)
    # a copy under the repository, where every runner (a container too) sees it, and safe from
    # the results directory this run replaces
    staging = c.matrix.root / ".cache" / "test-wheel" / cell.name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    wheel = Path(shutil.copy2(found, staging / found.name))
    c.reporter.rule(f"testing {wheel.name} in cell {of} (results: {cell.name})")
    return c.run([cell], "wheel tests", prebuilt_wheel=str(wheel))


def cmd_test_wheel(c: Context) -> int:
    return run_wheel_tests(c, c.cell(c.args.cell, c.args.name), Path(c.args.wheel), c.args.cell)


def cmd_cross(c: Context) -> int:
    tests = {test.name: test for test in wheel_tests(c.cells)}
    if (test := tests.get(c.args.cross)) is None:
        raise MatrixError(
            f"no wheel test {c.args.cross!r} in {c.matrix.file.name}; it has "
            f"{', '.join(tests) or 'none'} (a cpu and a cuda build cell of the same torch "
            "release and Python make a cross pair, one in each direction; a cell's "
            "also_pythons make its Python rows)"
        )
    wheel = Path(c.args.wheel) if c.args.wheel else c.artifacts / test.source.name
    return run_wheel_tests(c, test.cell, wheel, test.title)


def build_sdist(root: Path, out: Path, log: Reporter) -> Path:
    """The source distribution (python -m build --sdist): it needs no torch; a wheel built
    from it without torch stops at once with what to do (setup.py)."""
    before = set(out.glob("torch_fallback-*.tar.gz"))
    command = [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(root)]
    if run_process(command, log.line):
        raise MatrixError("python -m build --sdist failed; see above")
    (sdist,) = set(out.glob("torch_fallback-*.tar.gz")) - before or set(out.glob("*.tar.gz"))
    return sdist


def cmd_dist(c: Context) -> int:
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


def install_target(c: Context, name: str) -> tuple[Cell, Cell]:
    """(the cell to install into, the build cell whose wheel it takes) for a cell of the
    matrix or a wheel test (a Python row: the wheel of its cell on another Python)."""
    tests = {test.name: test for test in wheel_tests(c.cells)}
    if name in tests:
        return tests[name].target, tests[name].source
    cell = c.cell(name)
    return cell, cell


def cmd_publish_local(c: Context) -> int:
    wheels = sorted({w.name: w for w in c.artifacts.glob("*/torch_fallback-*.whl")}.values())
    if not wheels:
        raise MatrixError(f"no wheels under {c.artifacts}; build cells first (nox -s build-cpu)")
    targets = [install_target(c, name) for name in dict.fromkeys(c.args.cell or ["cpu"])]
    packages = cache_root(c.matrix.root) / "local-index"
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
            into = cell.model_copy(update={"name": f"{cell.name}-from-index"})
            title = f"installed from the local index (Python {cell.python})"
            status |= c.run(
                [into],
                title,
                index_url=f"{url}/simple/",
                requirement=f"torch-fallback=={version}",
            )
    return status


def cmd_workflows(c: Context) -> int:
    planned = plan_workflows(c.matrix)
    drift = check_workflows(c.matrix.root, planned, fix=not c.args.check)
    problems = "; ".join(f"{name}: {problem}" for name, problem in drift.items())
    if not drift:
        c.reporter.say(f"{len(planned)} generated file(s) up to date with matrix.yaml")
    elif not c.args.check:
        c.reporter.say(f"regenerated the files that were out of date ({problems})")
    else:
        c.reporter.error(
            f"the generated GitHub files are out of date with matrix.yaml ({problems}); "
            f"regenerate them with `{REGENERATE_COMMAND}` (or `nox -s workflows`) and commit them"
        )
        return EXIT_FAILED
    return EXIT_OK


def cmd_clean(c: Context) -> int:
    cache = cache_root(c.matrix.root)
    for partial in sorted(cache.glob("wheelhouse/.*.partial")):
        shutil.rmtree(partial, ignore_errors=True)
        c.reporter.say(f"removed interrupted wheelhouse fill {partial}")
    if runners.docker_problem() is None:
        client = runners.connect_docker()
        for container in client.containers.list(all=True, filters={"label": runners.LABEL}):
            container.remove(force=True)
            c.reporter.say(f"removed leftover container {container.name}")
        if c.args.caches:
            for volume in client.volumes.list(filters={"name": runners.CACHE_VOLUME}):
                volume.remove(force=True)
                c.reporter.say(f"removed volume {volume.name}")
            for image in client.images.list(filters={"label": f"{runners.LABEL}=image"}):
                client.images.remove(str(image.id), force=True)
                c.reporter.say(f"removed image {', '.join(image.tags) or image.short_id}")
    run_dir = Path(os.environ.get(runners.DOCKER_CACHE_ENV, ""))  # absolute: a host directory
    for directory in (cache, run_dir) if c.args.caches else ():
        if directory.is_absolute() and directory.exists():
            shutil.rmtree(directory, ignore_errors=True)
            c.reporter.say(f"removed {directory}")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    table = YAML(typ="safe").load(Path(__file__).with_name("cli.yaml"))
    parser = argparse.ArgumentParser(prog="python -m fallback_matrix", description=__doc__)
    parser.add_argument("--matrix", metavar="PATH", help="default: matrix.yaml here or above")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in table["commands"].items():
        sub = commands.add_parser(name, help=command["help"])
        handler = globals()[f"cmd_{name.replace('-', '_')}"]
        sub.set_defaults(handler=handler, index_url=None, gpus=False, cache_cap=None)
        arguments = table["every"] | command.get("arguments", {})
        if "runner" in command:
            arguments |= table["runner"]
            sub.set_defaults(runner=command["runner"])
        for argument, options in arguments.items():
            sub.add_argument(argument, **options)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reporter = Reporter()
    # a cancelled CI job (SIGTERM) cleans up like Ctrl-C: KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return int(args.handler(Context(args, reporter)))
    except MatrixError as error:
        reporter.error(str(error))
        return error.exit_code
    except KeyboardInterrupt:
        reporter.error("interrupted; containers of this run were removed")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
