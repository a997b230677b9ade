"""Fixtures of the tooling tests: no Docker daemon, no torch needed (except where marked docker).

fallback_matrix is installed (nox installs it editable from src/fallback_matrix).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]

VALID_MATRIX: dict[str, Any] = {
    "version": 1,
    "defaults": {
        "python": "3.11",
        "image": {"dockerfile": "docker/Dockerfile", "base": "python:3.11-slim-bookworm"},
        "tests": {"paths": ["tests/extension"], "markers": "not requires_cuda"},
        "runner": "build",
        "selections": ["pr", "main"],
    },
    "runners": {"build": ["ubuntu-24.04"], "gpu": ["self-hosted", "linux", "x64", "gpu"]},
    "variants": {
        "cpu": {
            "index_url": "https://download.pytorch.org/whl/cpu",
            "index_url_env": "FALLBACK_MATRIX_INDEX_URL_CPU",
        },
        "cuda": {
            "index_url": "https://pypi.org/simple",
            "index_url_env": "FALLBACK_MATRIX_INDEX_URL_CUDA",
        },
    },
    "project_tests": {"cell": "cpu", "tooling_paths": ["tests/matrix"]},
    "cells": [
        {"name": "cpu", "variant": "cpu", "python": "3.11", "torch": "2.13.0+cpu"},
        {
            "name": "cuda",
            "variant": "cuda",
            "python": "3.11",
            "torch": "2.14.1",
            "cuda": "13",
            "pypi": True,
        },
        {
            "name": "cuda-gpu",
            "variant": "cuda",
            "torch": "2.14.1",
            "cuda": "13",
            "gpu": True,
            "runner": "gpu",
            "selections": ["main"],
            "tests": {"markers": "requires_cuda"},
        },
    ],
}


@pytest.fixture
def matrix_data() -> dict[str, Any]:
    """A deep copy of a valid matrix, to break in one place per test."""
    return copy.deepcopy(VALID_MATRIX)


@pytest.fixture
def write_matrix(tmp_path: Path) -> Callable[[Any], Path]:
    """Write data (dumped as YAML) or text to tmp_path/matrix.yaml."""

    def write(content: Any) -> Path:
        path = tmp_path / "matrix.yaml"
        text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def cpu_cell(repo_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The repository's matrix and its cpu cell, with the host cache in tmp_path/cache."""
    from fallback_matrix.matrix import expand_cells, load_matrix, pick_cells

    monkeypatch.setenv("FALLBACK_MATRIX_CACHE", str(tmp_path / "cache"))
    matrix = load_matrix(repo_root / "matrix.yaml")
    (cell,) = pick_cells(expand_cells(matrix.spec), ["cpu"])
    return matrix, cell


@pytest.fixture
def reporter() -> Any:
    """A Reporter printing into a buffer: reporter.stream.getvalue() is what a user saw."""
    import io

    from fallback_matrix.report import Reporter

    return Reporter(io.StringIO())


@pytest.fixture
def cell_log(reporter: Any, tmp_path: Path) -> Any:
    with reporter.for_cell("cpu", tmp_path / "artifacts" / "cpu" / "cell.log") as log:
        yield log
