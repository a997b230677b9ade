"""python -m fallback_matrix: list, run, reproduce and summarize matrix cells; releases.

Exit status: 0 all passed, 1 a cell or test failed, 2 a wrong request (bad matrix, unknown cell),
130 interrupted (errors.py).
"""

import argparse
import os
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from rich.table import Table

from . import matrix, runners, summary
from .cache import CAP_ENV, DEFAULT_CAP
from .clean import cmd_clean
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, MatrixError
from .matrix import Cell, pick_cells
from .release import cmd_dist, cmd_publish_local, find_wheel
from .report import RESULT_FILE, Reporter
from .runners import RunnerChoice
from .running import TOOLING_ROW, cache_cap, run_cell, run_tooling_tests
from .workflows import REGENERATE_COMMAND, check_workflows, plan_workflows, wheel_tests


class Context:
    """What a command works on: its arguments, the matrix and its cells, the results root."""

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


# The handlers of the commands that run or show cells; release.py and clean.py hold the others.
# Each takes the Context and returns the exit status; COMMANDS below names them all.


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


@dataclass(frozen=True)
class Argument:
    """One argument of a command, as argparse's ``add_argument(*flags, **options)``."""

    flags: tuple[str, ...]
    options: Mapping[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Argument:
    return Argument(flags, options)


@dataclass(frozen=True)
class Command:
    """A subcommand: its handler (the Context in, the exit status out), its help and its own
    arguments. ``runner``: set for a command that runs cells, the runner they run on by
    default; such a command also takes the runner options (``runner_options``)."""

    handler: Callable[[Context], int]
    help: str
    arguments: tuple[Argument, ...] = ()
    runner: RunnerChoice | None = None


EVERY_COMMAND = (arg("--artifacts", metavar="DIR", help="results root (default <repo>/artifacts)"),)


def runner_options(default: RunnerChoice) -> tuple[Argument, ...]:
    """The options of a command that runs cells, ``default`` its runner unless --runner."""
    return (
        arg(
            "--runner",
            choices=list(get_args(RunnerChoice)),
            default=default,
            help="where the job runs (default %(default)s; auto: docker when a daemon answers)",
        ),
        arg("--gpus", action="store_true", help="pass the host's GPUs in"),
        arg(
            "--index-url",
            action="append",
            metavar="VARIANT=URL",
            help="the index torch of VARIANT (cpu, cuda) comes from; overrides matrix.yaml",
        ),
        arg(
            "--cache-cap",
            metavar="SIZE",
            help="cap of the cached environments and of the wheelhouses, each pruned least "
            f"recently used first (e.g. 20GB, 500MB, off; default ${CAP_ENV}, else {DEFAULT_CAP})",
        ),
    )


# Every command of `python -m fallback_matrix`, in the order --help lists them.
COMMANDS: dict[str, Command] = {
    "list": Command(cmd_list, "show the cells", runner="auto"),
    "run": Command(cmd_run, "build and test cells", (arg("cells", nargs="+"),), runner="auto"),
    "reproduce": Command(
        cmd_reproduce, "run one cell as CI runs it", (arg("cell"),), runner="docker"
    ),
    "summary": Command(
        cmd_summary,
        "table of the last results under artifacts/ (and markdown in $GITHUB_STEP_SUMMARY)",
    ),
    "project-tests": Command(
        cmd_project_tests, "tooling tests, then the project cell", runner="local"
    ),
    "models": Command(
        cmd_models,
        "the model zoo in matrix.yaml's `models` cell: every model, every placement it has",
        runner="auto",
    ),
    "test-wheel": Command(
        cmd_test_wheel,
        "test a wheel built elsewhere",
        (
            arg("cell", help="the cell whose torch and tests to use"),
            arg("--wheel", required=True, help="the wheel, or a directory with one"),
            arg("--as", dest="name", help="name of the results (default: the cell)"),
        ),
        runner="docker",
    ),
    "cross": Command(
        cmd_cross,
        "a wheel test: one build cell's wheel on the other torch build of its release "
        "(cross-SOURCE-on-TARGET), or on another Python (CELL-on-pyXY)",
        (
            arg(
                "cross",
                help="its name, cross-SOURCE-on-TARGET or CELL-on-pyXY "
                "(python -m fallback_matrix list)",
            ),
            arg("--wheel", help="the wheel, or a directory with one (default: artifacts/SOURCE)"),
        ),
        runner="docker",
    ),
    "tooling-tests": Command(cmd_tooling_tests, "the tooling's own tests (tests/matrix)"),
    "dist": Command(
        cmd_dist,
        "collect and check the PyPI cells' wheels into dist/, with the sdist",
        (
            arg("cells", nargs="+"),
            arg("--out", default="dist", help="where to (default dist/)"),
            arg("--tag", help="the version tag, e.g. v0.1.0 (default $GITHUB_REF_NAME)"),
        ),
    ),
    "publish-local": Command(
        cmd_publish_local,
        "twine upload of the wheels and the sdist to a local index; install from it",
        (
            arg(
                "--cell",
                action="append",
                help="a cell, or a Python row (CELL-on-pyXY), to install into; repeat it for "
                "several (default cpu)",
            ),
        ),
        runner="docker",
    ),
    "workflows": Command(
        cmd_workflows,
        "generate .github/workflows from matrix.yaml",
        (arg("--check", action="store_true", help="only compare; exit 1 on drift"),),
    ),
    "clean": Command(
        cmd_clean,
        "remove leftover containers and interrupted fills",
        (arg("--caches", action="store_true", help="also images, volume, wheelhouses"),),
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fallback_matrix", description=__doc__)
    parser.add_argument("--matrix", metavar="PATH", help="default: matrix.yaml here or above")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.help)
        sub.set_defaults(index_url=None, gpus=False, cache_cap=None)  # Context reads them
        arguments = [*EVERY_COMMAND, *command.arguments]
        if command.runner is not None:
            arguments += runner_options(command.runner)
        for argument in arguments:
            sub.add_argument(*argument.flags, **argument.options)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (argparse exits EXIT_USAGE on a wrong command line)."""
    args = build_parser().parse_args(argv)
    command = COMMANDS[args.command]
    reporter = Reporter()
    # a cancelled CI job (SIGTERM) cleans up like Ctrl-C: KeyboardInterrupt
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return int(command.handler(Context(args, reporter)))
    except MatrixError as error:
        reporter.error(str(error))
        return error.exit_code
    except KeyboardInterrupt:
        reporter.error("interrupted; containers of this run were removed")
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
