"""Fixtures of the tooling tests: no Docker daemon, no torch needed (except where marked docker).

fallback_matrix is imported from src/ by file location, so putting src/ on
sys.path (which would also expose the uninstalled torch_fallback) is avoided.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]


def _import_fallback_matrix() -> None:
    if "fallback_matrix" in sys.modules:
        return
    package_dir = REPO_ROOT / "src" / "fallback_matrix"
    spec = importlib.util.spec_from_file_location(
        "fallback_matrix",
        package_dir / "__init__.py",
        submodule_search_locations=[str(package_dir)],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fallback_matrix"] = module
    spec.loader.exec_module(module)


_import_fallback_matrix()

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
def reporter() -> Any:
    """A Reporter printing into a buffer: reporter.console.file.getvalue() is what a user saw."""
    import io

    from rich.console import Console

    from fallback_matrix.console import Reporter

    return Reporter(Console(file=io.StringIO(), width=200, highlight=False, soft_wrap=True))


@pytest.fixture
def cell_log(reporter: Any, tmp_path: Path) -> Any:
    from fallback_matrix.console import CellLog

    with CellLog(reporter, "cpu", tmp_path / "artifacts" / "cpu" / "cell.log") as log:
        yield log
