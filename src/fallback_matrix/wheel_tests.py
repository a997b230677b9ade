"""Test a wheel built elsewhere in a cell's environment: GPU jobs and cross-variant checks.

``python -m fallback_matrix test-wheel CELL --wheel PATH [--gpus] [--as NAME]``
installs the given wheel (instead of building one) into CELL's environment,
in CELL's image, and runs CELL's tests; results go to ``artifacts/<NAME>/``
(NAME defaults to CELL). CI uses it for:

- a GPU cell: the wheel of the matching build cell on a GPU runner, ``--gpus``
- a cross check: the wheel built against CPU-only torch, on a CUDA cell's torch
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from .cells import Cell
from .errors import MatrixError

STAGING_DIR = Path(".cache") / "test-wheel"


def cross_name(cpu_cell: str, cuda_cell: str) -> str:
    """The job and results name of a cross check: cross-<cpu>-on-<cuda>."""
    return f"cross-{cpu_cell}-on-{cuda_cell}"


def renamed(cell: Cell, name: str) -> Cell:
    """``cell`` under another name: its results, wheelhouse and build dir are kept apart."""
    return cell if name == cell.name else dataclasses.replace(cell, name=name)


def find_wheel(path: Path) -> Path:
    """``path`` if it is a wheel, else the one torch_fallback wheel in the directory ``path``."""
    if path.is_file() and path.suffix == ".whl":
        return path
    if path.is_dir():
        wheels = sorted(path.glob("torch_fallback-*.whl"))
        if len(wheels) == 1:
            return wheels[0]
        found = ", ".join(w.name for w in wheels) or "none"
        raise MatrixError(
            f"--wheel {path}: expected exactly one torch_fallback-*.whl in it, found {found}; "
            "name the wheel file itself"
        )
    raise MatrixError(
        f"--wheel {path}: no such wheel or directory; build one first "
        "(nox -s build-CELL puts it in artifacts/CELL/)"
    )


def stage_wheel(repo: Path, wheel: Path, name: str) -> Path:
    """A copy of ``wheel`` under the repository, where every runner (a container too) sees it.

    The copy also keeps the wheel safe when it lies in the results directory this run replaces.
    """
    staging = repo / STAGING_DIR / name
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    target = staging / wheel.name
    shutil.copy2(wheel, target)
    return target
