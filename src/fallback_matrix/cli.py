"""python -m fallback_matrix: list, run, reproduce and summarize matrix cells.

Exit status: 0 when everything asked for passed, 1 when a cell or test failed,
2 when the request itself was wrong (bad matrix file, unknown cell, no runner).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from rich.table import Table

from .cells import Cell, expand_cells, parse_index_override, pick_cells
from .errors import MatrixError
from .loader import LoadedMatrix, find_matrix_file, load_matrix
from .paths import artifacts_root, cache_root
from .pipeline import CellResult, run_cells
from .report import Reporter
from .runners.choose import decide_runner, make_runner
from .summary import (
    JUNIT_FILE,
    RESULT_FILE,
    closing_line,
    collect_rows,
    render_markdown,
    render_table,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
TOOLING_ROW = "tooling"


# --- shared helpers ------------------------------------------------------------------------------


def _matrix(args: argparse.Namespace) -> LoadedMatrix:
    file = Path(args.matrix) if args.matrix else find_matrix_file(Path.cwd())
    return load_matrix(file)


def _cells(args: argparse.Namespace, matrix: LoadedMatrix) -> tuple[Cell, ...]:
    overrides = dict(parse_index_override(text) for text in getattr(args, "index_url", None) or [])
    return expand_cells(
        matrix.spec,
        environ=os.environ,
        index_overrides=overrides,
        selection=getattr(args, "selection", None),
    )


def _artifacts(args: argparse.Namespace, matrix: LoadedMatrix) -> Path:
    return (
        Path(args.artifacts).resolve()
        if getattr(args, "artifacts", None)
        else artifacts_root(matrix.root)
    )


def _publish(reporter: Reporter, artifacts: Path, names: Sequence[str], title: str) -> None:
    """The summary table on the terminal, in $GITHUB_STEP_SUMMARY when set, and a closing line."""
    rows = collect_rows(artifacts, names)
    reporter.table(render_table(rows, title=title))
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(render_markdown(rows, title=title))
    reporter.line(closing_line(rows, label=title))


def _report_failures(reporter: Reporter, results: Sequence[CellResult]) -> int:
    failed = [result for result in results if not result.passed]
    for result in failed:
        reporter.error(result.error or f"cell {result.cell} failed; log: {result.log}")
    return EXIT_FAILED if failed else EXIT_OK


def _execute(
    args: argparse.Namespace,
    reporter: Reporter,
    matrix: LoadedMatrix,
    cells: Sequence[Cell],
    runner_choice: str,
) -> list[CellResult]:
    decision = decide_runner(runner_choice)  # type: ignore[arg-type]
    reporter.say(f"runner {decision.name} ({decision.reason})")
    return run_cells(
        matrix,
        cells,
        make_runner(decision),
        cache_root=cache_root(matrix.root),
        artifacts_root=_artifacts(args, matrix),
        gpus=args.gpus,
        reporter=reporter,
    )


# --- subcommands ---------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace, reporter: Reporter) -> int:
    matrix = _matrix(args)
    cells = _cells(args, matrix)
    if args.json:
        payload = [
            {
                "name": c.name,
                "variant": c.variant,
                "python": c.python,
                "torch": c.torch,
                "cuda": c.cuda,
                "gpu": c.gpu,
                "runner": c.runner,
                "runner_labels": list(c.runner_labels),
                "selections": list(c.selections),
                "index_url": c.index.url,
                "image": {"dockerfile": c.image.dockerfile, "base": c.image.base},
                "tests": {
                    "paths": list(c.tests.paths),
                    "markers": c.tests.markers,
                    "allow_empty": c.tests.allow_empty,
                },
            }
            for c in cells
        ]
        print(json.dumps(payload, indent=2))
        return EXIT_OK
    table = Table(
        title=f"cells of {matrix.file.name}" + (f" ({args.selection})" if args.selection else "")
    )
    for header in (
        "cell",
        "variant",
        "python",
        "torch",
        "cuda",
        "gpu",
        "runs on",
        "workflows",
        "tests",
    ):
        table.add_column(header)
    for c in cells:
        table.add_row(
            c.name,
            c.variant,
            c.python,
            c.torch,
            c.cuda or "-",
            "yes" if c.gpu else "-",
            ", ".join(c.runner_labels),
            ", ".join(c.selections),
            f"{' '.join(c.tests.paths)} -m '{c.tests.markers}'",
        )
    reporter.table(table)
    for variant, index in sorted({(c.variant, c.index) for c in cells}):
        reporter.line(f"index {variant}: {index.url}  ({index.source})")
    return EXIT_OK


def cmd_run(args: argparse.Namespace, reporter: Reporter) -> int:
    matrix = _matrix(args)
    cells = pick_cells(_cells(args, matrix), args.cells)
    results = _execute(args, reporter, matrix, cells, args.runner)
    _publish(reporter, _artifacts(args, matrix), [c.name for c in cells], title="matrix")
    return _report_failures(reporter, results)


def cmd_reproduce(args: argparse.Namespace, reporter: Reporter) -> int:
    matrix = _matrix(args)
    (cell,) = pick_cells(_cells(args, matrix), [args.cell])
    reporter.rule(f"reproducing cell {cell.name} as CI runs it (nox -s build-{cell.name})")
    results = _execute(args, reporter, matrix, [cell], args.runner)
    _publish(reporter, _artifacts(args, matrix), [cell.name], title="matrix")
    status = _report_failures(reporter, results)
    if status != EXIT_OK:
        reporter.say(
            f"artifacts of the run: {_artifacts(args, matrix) / cell.name}/ "
            "(cell.log, junit.xml, result.json)"
        )
    return status


def cmd_summary(args: argparse.Namespace, reporter: Reporter) -> int:
    root = Path(args.artifacts).resolve() if args.artifacts else artifacts_root(_matrix(args).root)
    rows = collect_rows(root)
    if not rows:
        reporter.error(
            f"no cell results under {root}; run cells first (python -m fallback_matrix run CELL)"
        )
        return EXIT_USAGE
    reporter.table(render_table(rows))
    markdown_target = args.markdown or os.environ.get("GITHUB_STEP_SUMMARY")
    if markdown_target == "-":
        print(render_markdown(rows))
    elif markdown_target:
        with open(markdown_target, "a", encoding="utf-8") as handle:
            handle.write(render_markdown(rows))
        reporter.say(f"markdown summary appended to {markdown_target}")
    reporter.line(closing_line(rows))
    return EXIT_OK if all(row.result == "passed" for row in rows) else EXIT_FAILED


def run_tooling_tests(matrix: LoadedMatrix, artifacts: Path, reporter: Reporter) -> bool:
    """The tooling's own tests on the host, recorded like a cell named 'tooling'."""
    target = artifacts / TOOLING_ROW
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    paths = [str(matrix.root / path) for path in matrix.spec.project_tests.tooling_paths]
    reporter.rule(f"tooling tests: {' '.join(matrix.spec.project_tests.tooling_paths)}")
    command = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        "-p",
        "no:cacheprovider",
        "--junitxml",
        str(target / JUNIT_FILE),
        "-o",
        f"junit_suite_name={TOOLING_ROW}",
    ]
    status = subprocess.call(command, cwd=matrix.root)
    record = {
        "cell": TOOLING_ROW,
        "runner": "host",
        "exit_code": status,
        "seconds": None,
        "error": None,
    }
    (target / RESULT_FILE).write_text(json.dumps(record) + "\n", encoding="utf-8")
    return status == 0


def cmd_project_tests(args: argparse.Namespace, reporter: Reporter) -> int:
    matrix = _matrix(args)
    (cell,) = pick_cells(_cells(args, matrix), [matrix.spec.project_tests.cell])
    artifacts = _artifacts(args, matrix)
    tooling_ok = run_tooling_tests(matrix, artifacts, reporter)
    results = _execute(args, reporter, matrix, [cell], args.runner)
    _publish(reporter, artifacts, [TOOLING_ROW, cell.name], title="tests")
    status = _report_failures(reporter, results)
    if not tooling_ok:
        reporter.error(
            "tooling tests failed; see the pytest output above "
            f"({artifacts / TOOLING_ROW / JUNIT_FILE})"
        )
        status = EXIT_FAILED
    return status


def cmd_test_wheel(args: argparse.Namespace, reporter: Reporter) -> int:
    from .pipeline import run_cell
    from .wheel_tests import find_wheel, renamed, stage_wheel

    matrix = _matrix(args)
    (cell,) = pick_cells(_cells(args, matrix), [args.cell])
    cell = renamed(cell, args.name or cell.name)
    wheel = stage_wheel(matrix.root, find_wheel(Path(args.wheel)), cell.name)
    reporter.rule(f"testing {wheel.name} in cell {args.cell} (results: {cell.name})")
    decision = decide_runner(args.runner)
    reporter.say(f"runner {decision.name} ({decision.reason})")
    result = run_cell(
        matrix,
        cell,
        make_runner(decision),
        cache_root=cache_root(matrix.root),
        artifacts_root=_artifacts(args, matrix),
        gpus=args.gpus,
        reporter=reporter,
        prebuilt_wheel=wheel,
    )
    _publish(reporter, _artifacts(args, matrix), [cell.name], title="wheel tests")
    return _report_failures(reporter, [result])


def cmd_tooling_tests(args: argparse.Namespace, reporter: Reporter) -> int:
    matrix = _matrix(args)
    artifacts = _artifacts(args, matrix)
    passed = run_tooling_tests(matrix, artifacts, reporter)
    _publish(reporter, artifacts, [TOOLING_ROW], title="tooling")
    return EXIT_OK if passed else EXIT_FAILED


def cmd_dist(args: argparse.Namespace, reporter: Reporter) -> int:
    from .release import collect_dist

    matrix = _matrix(args)
    cells = pick_cells(_cells(args, matrix), args.cells)
    tag = args.tag or os.environ.get("GITHUB_REF_NAME") or None
    if tag and not tag.startswith("v"):
        tag = None  # not a version tag (a branch): the version is not checked against it
    out = Path(args.out).resolve()
    for wheel in collect_dist(_artifacts(args, matrix), cells, out, tag):
        reporter.say(f"{wheel.name} -> {out}")
    return EXIT_OK


def cmd_publish_local(args: argparse.Namespace, reporter: Reporter) -> int:
    """twine upload to a local pypiserver, then a fresh container installs from it."""
    from .pipeline import run_cell
    from .release import LocalIndex, cell_wheel
    from .wheel_tests import renamed

    matrix = _matrix(args)
    artifacts = _artifacts(args, matrix)
    (cell,) = pick_cells(_cells(args, matrix), [args.cell])
    wheels = sorted({w.name: w for w in artifacts.glob("*/torch_fallback-*.whl")}.values())
    if not wheels:
        reporter.error(f"no wheels under {artifacts}; build cells first (nox -s build-cpu)")
        return EXIT_USAGE
    wanted = cell_wheel(artifacts, cell.name)
    version = wanted.name.split("-")[1]
    target = renamed(cell, f"{cell.name}-from-index")
    log_dir = artifacts / "publish-local"
    packages = cache_root(matrix.root) / "local-index"
    for stale in (log_dir, packages):
        shutil.rmtree(stale, ignore_errors=True)
    with (
        reporter.for_cell("publish", log_dir / "publish.log") as log,
        LocalIndex(Path(args.tools), packages, log) as index,
    ):
        index.upload(wheels)
        decision = decide_runner("docker")
        result = run_cell(
            matrix,
            target,
            make_runner(decision),
            cache_root=cache_root(matrix.root),
            artifacts_root=artifacts,
            gpus=False,
            reporter=reporter,
            index_url=f"{index.url}/simple/",
            requirement=f"torch-fallback=={version}",
        )
    _publish(reporter, artifacts, [target.name], title="installed from the local index")
    return _report_failures(reporter, [result])


def cmd_workflows(args: argparse.Namespace, reporter: Reporter) -> int:
    from .workflows import check_workflows, plan_workflows, write_workflows

    matrix = _matrix(args)
    planned = plan_workflows(matrix)
    if args.check:
        drift = check_workflows(matrix.root, planned)
        if drift:
            reporter.error(drift.describe())
            return EXIT_FAILED
        reporter.say(f"{len(planned)} generated file(s) up to date with matrix.yaml")
        return EXIT_OK
    changed = write_workflows(matrix.root, planned)
    for path in changed:
        reporter.say(f"wrote {path.relative_to(matrix.root)}")
    if not changed:
        reporter.say("generated files already up to date with matrix.yaml")
    return EXIT_OK


def cmd_clean(args: argparse.Namespace, reporter: Reporter) -> int:
    from .runners.docker_runner import (
        CACHE_VOLUME,
        DOCKER_CACHE_ENV,
        LABEL,
        leftover_containers,
    )
    from .runners.engine import engine_status

    matrix = _matrix(args)
    cache = cache_root(matrix.root)
    for partial in sorted(cache.glob("wheelhouse/.*.partial")):
        shutil.rmtree(partial, ignore_errors=True)
        reporter.say(f"removed interrupted wheelhouse fill {partial}")
    if engine_status().available:
        from .runners.engine import connect_docker

        client = connect_docker()
        for container in leftover_containers(client):
            container.remove(force=True)
            reporter.say(f"removed leftover container {container.name}")
        if args.caches:
            run_dir = os.environ.get(DOCKER_CACHE_ENV, "")
            if run_dir[:1] == "/" and Path(run_dir).exists():
                shutil.rmtree(run_dir, ignore_errors=True)
                reporter.say(f"removed {run_dir} (${DOCKER_CACHE_ENV})")
            for volume in client.volumes.list(filters={"name": CACHE_VOLUME}):
                volume.remove(force=True)
                reporter.say(f"removed volume {volume.name}")
            for image in client.images.list(filters={"label": f"{LABEL}=image"}):
                client.images.remove(str(image.id), force=True)
                reporter.say(f"removed image {', '.join(image.tags) or image.short_id}")
    if args.caches and cache.exists():
        shutil.rmtree(cache)
        reporter.say(f"removed {cache}")
    return EXIT_OK


# --- parser --------------------------------------------------------------------------------------


def _add_run_options(parser: argparse.ArgumentParser, default_runner: str) -> None:
    parser.add_argument(
        "--runner",
        choices=("docker", "local", "auto"),
        default=default_runner,
        help=f"where the job runs (default {default_runner}; "
        "auto: docker when a daemon answers, else local)",
    )
    parser.add_argument(
        "--gpus", action="store_true", help="pass the host's GPUs into the container"
    )
    parser.add_argument(
        "--artifacts", metavar="DIR", help="artifacts root (default <repo>/artifacts)"
    )
    _add_index_option(parser)


def _add_index_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--index-url",
        action="append",
        metavar="VARIANT=URL",
        help="the index torch of VARIANT (cpu, cuda) comes from; "
        "overrides matrix.yaml and its env variable",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fallback_matrix", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--matrix", metavar="PATH", help="matrix file (default: matrix.yaml here or above)"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="show the cells")
    listing.add_argument("--selection", choices=("pr", "main"), help="only cells of this workflow")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    _add_index_option(listing)
    listing.set_defaults(handler=cmd_list)

    run = commands.add_parser("run", help="build and test cells")
    run.add_argument("cells", nargs="+", metavar="CELL")
    _add_run_options(run, default_runner="auto")
    run.set_defaults(handler=cmd_run)

    reproduce = commands.add_parser("reproduce", help="run exactly one cell as CI runs it (Docker)")
    reproduce.add_argument("cell", metavar="CELL")
    _add_run_options(reproduce, default_runner="docker")
    reproduce.set_defaults(handler=cmd_reproduce)

    summary = commands.add_parser("summary", help="table of the last results under artifacts/")
    summary.add_argument(
        "--artifacts", metavar="DIR", help="artifacts root (default <repo>/artifacts)"
    )
    summary.add_argument(
        "--markdown",
        metavar="PATH",
        help="also append GitHub markdown to PATH ('-': stdout; default $GITHUB_STEP_SUMMARY)",
    )
    summary.set_defaults(handler=cmd_summary)

    tests = commands.add_parser(
        "project-tests", help="the tooling tests, then the project-tests cell (nox -s tests)"
    )
    _add_run_options(tests, default_runner="local")
    tests.set_defaults(handler=cmd_project_tests)

    test_wheel = commands.add_parser(
        "test-wheel", help="test a wheel built elsewhere in a cell's environment (GPU, cross jobs)"
    )
    test_wheel.add_argument("cell", metavar="CELL", help="the cell whose torch and tests to use")
    test_wheel.add_argument(
        "--wheel",
        required=True,
        metavar="PATH",
        help="the wheel, or a directory holding one (e.g. artifacts/cuda)",
    )
    test_wheel.add_argument(
        "--as",
        dest="name",
        metavar="NAME",
        help="name of the results (artifacts/NAME/; default: the cell)",
    )
    _add_run_options(test_wheel, default_runner="docker")
    test_wheel.set_defaults(handler=cmd_test_wheel)

    tooling = commands.add_parser("tooling-tests", help="the tooling's own tests (tests/matrix)")
    tooling.add_argument("--artifacts", metavar="DIR", help="artifacts root")
    tooling.set_defaults(handler=cmd_tooling_tests)

    dist = commands.add_parser("dist", help="collect and check the PyPI cells' wheels into dist/")
    dist.add_argument("cells", nargs="+", metavar="CELL")
    dist.add_argument("--out", default="dist", metavar="DIR", help="where to (default dist/)")
    dist.add_argument(
        "--tag", help="the version tag, e.g. v0.1.0 (default $GITHUB_REF_NAME when it is one)"
    )
    dist.add_argument("--artifacts", metavar="DIR", help="artifacts root")
    dist.set_defaults(handler=cmd_dist)

    publish = commands.add_parser(
        "publish-local",
        help="twine upload every built wheel to a local pypiserver, then install one cell's "
        "torch-fallback from it in a fresh container and run the cell's tests",
    )
    publish.add_argument("--cell", default="cpu", help="the cell to install into (default cpu)")
    publish.add_argument(
        "--tools", required=True, metavar="DIR", help="directory holding pypi-server and twine"
    )
    publish.add_argument("--artifacts", metavar="DIR", help="artifacts root")
    _add_index_option(publish)
    publish.set_defaults(handler=cmd_publish_local, gpus=False)

    workflows = commands.add_parser("workflows", help="generate .github/workflows from matrix.yaml")
    workflows.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 when the committed workflows differ from matrix.yaml",
    )
    workflows.set_defaults(handler=cmd_workflows)

    clean = commands.add_parser(
        "clean", help="remove leftover containers and interrupted wheelhouse fills"
    )
    clean.add_argument(
        "--caches", action="store_true", help="also remove the caches: images, volume, wheelhouses"
    )
    clean.set_defaults(handler=cmd_clean)
    return parser


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a cancelled CI job) cleans up like Ctrl-C: containers are removed."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    reporter = Reporter()
    try:
        with _terminate_as_interrupt():
            return int(args.handler(args, reporter))
    except MatrixError as error:
        reporter.error(str(error))
        return EXIT_USAGE
    except KeyboardInterrupt:
        reporter.error("interrupted; containers of this run were removed")
        return 130
