"""The noxfile's sessions: every one CI calls exists; `nox` alone runs the tests; the optional
ones are no default sessions, and tags group them."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

from fallback_matrix.matrix import expand_cells, load_matrix
from fallback_matrix.workflows import wheel_tests

nox = pytest.importorskip("nox")


@pytest.fixture
def sessions(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The sessions noxfile.py registers (name: nox's record of it), in a registry of its own."""
    from nox import registry

    monkeypatch.setattr(registry, "_REGISTRY", {})
    monkeypatch.setattr(nox.options, "sessions", nox.options.sessions)  # restored afterwards
    spec = importlib.util.spec_from_file_location("noxfile_under_test", repo_root / "noxfile.py")
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return dict(registry.get())


def called_by_ci(repo_root: Path) -> set[str]:
    """The sessions the workflows and .ci/run name: `nox -s NAME... [-- ARGS]`."""
    files = [*sorted((repo_root / ".github" / "workflows").glob("*.yml")), repo_root / ".ci/run"]
    names: set[str] = set()
    for file in files:
        for match in re.finditer(r"nox -s ([\w -]+?)(?: --|\"|$)", file.read_text(), re.M):
            names |= set(match.group(1).split())
    return names


def test_every_session_ci_calls_exists(sessions: dict[str, Any], repo_root: Path) -> None:
    called = called_by_ci(repo_root)
    assert {"tests", "lint", "tooling-tests", "workflows", "build-cpu"} <= called
    assert called - set(sessions) == set()


def test_every_session_keeps_its_name(sessions: dict[str, Any], repo_root: Path) -> None:
    cells = expand_cells(load_matrix(repo_root / "matrix.yaml").spec)
    fixed = {"tests", "models", "reproduce", "summary", "test-wheel", "tooling-tests", "dist"}
    fixed |= {"clean", "publish-local", "workflows", "lint"}
    derived = {f"build-{cell.name}" for cell in cells} | {t.name for t in wheel_tests(cells)}
    assert set(sessions) == fixed | derived


def test_nox_alone_runs_the_tests_and_only_routine_sessions_are_default(
    sessions: dict[str, Any], repo_root: Path
) -> None:
    assert nox.options.sessions == ["tests"]
    cells = expand_cells(load_matrix(repo_root / "matrix.yaml").spec)
    pr_builds = {f"build-{cell.name}" for cell in cells if "pr" in cell.selections}
    assert pr_builds and len(pr_builds) < len(cells)  # the matrix has main-only cells
    default = {name for name, func in sessions.items() if func.default}
    assert default == {"tests", "lint", "tooling-tests"} | pr_builds


def test_tags_group_the_builds_the_wheel_tests_and_the_checks(
    sessions: dict[str, Any], repo_root: Path
) -> None:
    cells = expand_cells(load_matrix(repo_root / "matrix.yaml").spec)
    for cell in cells:
        assert sessions[f"build-{cell.name}"].tags == ["build", *cell.selections]
    for test in wheel_tests(cells):
        assert sessions[test.name].tags == ["wheel-test"]
    checks = {name for name, func in sessions.items() if "checks" in func.tags}
    assert checks == {"lint", "tooling-tests", "workflows"}
    # `nox -t TAG` runs its sessions without arguments: none that needs one has a tag
    for name in ("reproduce", "test-wheel", "dist"):
        assert sessions[name].tags == [], name
