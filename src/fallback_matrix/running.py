"""Running cells from the host: a cell's job (``make_job``), run by a runner with its wheelhouse
filled first and its result recorded (``run_cell``); the tooling's own tests, recorded like a
cell (``run_tooling_tests``)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import cache, summary
from .errors import JOB_EXIT_REASONS, CellError, MatrixError
from .job import Job, pytest_command
from .matrix import Cell, LoadedMatrix
from .report import JUNIT_FILE, LOG_FILE, RESULT_FILE, Reporter
from .runners import Runner
from .wheelhouse import ensure_wheelhouse, wheelhouse_path

TOOLING_ROW = "tooling"  # the results (artifacts/tooling/) and summary row of the tooling tests
# Set (to 1) by a CI script that runs one cell's job twice under two names: `nox -s tests`
# (its project cell) and then the main job's `build-<cell>`. The second keeps the first's
# passed result when the job and the sources are the same.
REUSE_PASSED_ENV = "FALLBACK_MATRIX_REUSE_PASSED"


def source_files(repo: Path) -> list[str]:
    """The files a build needs: git's tracked and untracked-but-not-ignored files."""
    git = ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        names = subprocess.run(git, capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        message = "git ls-files failed there: a build takes the files git tracks; clone the repo"
        raise MatrixError(f"{repo} is not a git checkout ({message})") from None
    return sorted(name for name in set(names) if name and (repo / name).is_file())


def make_job(
    matrix: LoadedMatrix,
    cell: Cell,
    cache: Path,
    artifacts: Path,
    sources: list[str] | None = None,
    **options: Any,
) -> Job:
    """The job of ``cell`` with host paths (the Docker runner maps them into its container);
    ``sources``: source_files(matrix.root), where the caller has listed them already."""
    local, tests, image = cache / "local", cell.tests, cell.image
    return Job(
        cell=cell.name,
        **cell.model_dump(include={"python", "torch", "cuda", "gpu", "pypi"}),
        test_paths=list(tests.paths),
        test_markers=tests.markers,
        test_workers=str(tests.workers),
        sources=source_files(matrix.root) if sources is None else sources,
        repo=str(matrix.root),
        cache=str(local),
        work=str(local / "work" / cell.name),
        artifacts=str(artifacts),
        dockerfile=image.dockerfile,
        base_image=image.base,
        **options,
    )


def job_fingerprint(
    matrix: LoadedMatrix, cell: Cell, runner: Runner, options: Mapping, sources: list[str]
) -> str:
    """What decides a cell's result: its definition, the runner, the options and the
    contents of every source file (``sources``, source_files' list)."""
    digest = hashlib.sha256()
    definition = [cell.model_dump(mode="json"), runner.name, sorted(options.items())]
    digest.update(json.dumps(definition, sort_keys=True, default=str).encode())
    for name in sources:
        digest.update(name.encode() + b"\0" + (matrix.root / name).read_bytes() + b"\0")
    return digest.hexdigest()


def passed_earlier(out: Path, fingerprint: str) -> dict[str, Any] | None:
    """The passed result already in ``out`` of the same job on the same sources, if any."""
    record = summary.read_json(out / RESULT_FILE)
    passed = record.get("exit_code") == 0 and not record.get("error")
    return record if passed and record.get("fingerprint") == fingerprint else None


def workers(value: int | str) -> str:
    """A selection's pytest-xdist workers in words."""
    return "no xdist" if value == 0 else f"pytest-xdist -n {value}"


def cache_cap(option: str | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """The cap in bytes of each cache store: --cache-cap, else $FALLBACK_MATRIX_CACHE_CAP, else
    the default; None: off. A cap that is not a size raises CapError."""
    return cache.parse_cap(option or environ.get(cache.CAP_ENV) or cache.DEFAULT_CAP)


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
    result.json's record, returned, never raised. With $FALLBACK_MATRIX_REUSE_PASSED=1, a
    passed result of the same job on the same sources in ``out`` stands, not run again."""
    sources = source_files(matrix.root)
    fingerprint = job_fingerprint(matrix, cell, runner, options, sources)
    if os.environ.get(REUSE_PASSED_ENV) == "1" and (earlier := passed_earlier(out, fingerprint)):
        reporter.say(
            f"cell {cell.name}: the same job on the same sources passed earlier in this run "
            f"({out / RESULT_FILE}); its result stands ({REUSE_PASSED_ENV}=1)"
        )
        return earlier
    shutil.rmtree(out, ignore_errors=True)
    started, error, exit_code, where = time.monotonic(), None, 1, runner.name
    with reporter.for_cell(cell.name, out / LOG_FILE) as log:
        tests = f"tests {' '.join(cell.tests.paths)} -m {cell.tests.markers!r}"
        tests += f" ({workers(cell.tests.workers)})"
        index = f"index {cell.index.url} ({cell.index.source})"
        log.say(f"torch=={cell.torch} ({cell.variant}), Python {cell.python}, {tests}, {index}")
        try:
            root, pyproject = cache.cache_root(), matrix.root / "pyproject.toml"
            with cache.in_use(wheelhouse_path(cell, pyproject, root)):
                wheelhouse = ensure_wheelhouse(cell, pyproject, root, log)
                prune_wheelhouses(wheelhouse, options.get("cache_cap"), log)
                job = make_job(
                    matrix, cell, root, out, sources, wheelhouse=str(wheelhouse), **options
                )
                exit_code, where = runner.run(job, log)
            if exit_code != 0:
                status = f"exit status {exit_code}{JOB_EXIT_REASONS.get(exit_code, '')}"
                error = f"cell {cell.name} failed in {where} ({status}); log: {log.path}"
        except CellError as problem:
            error = str(problem) if cell.name in str(problem) else f"cell {cell.name}: {problem}"
            log.line(f"error: {error}")
    seconds = round(time.monotonic() - started, 1)
    record = summary.read_json(out / RESULT_FILE)  # the job's steps, when it ran
    record |= {"cell": cell.name, "runner": runner.name, "where": where, "exit_code": exit_code}
    record |= {"seconds": seconds, "error": error or record.get("error")}
    record["fingerprint"] = fingerprint
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
