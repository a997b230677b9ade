"""Where fallback_matrix keeps its caches and artifacts on the host."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CACHE_ENV = "FALLBACK_MATRIX_CACHE"


def cache_root(repo_root: Path, environ: Mapping[str, str] | None = None) -> Path:
    """<repo>/.cache/fallback-matrix, or $FALLBACK_MATRIX_CACHE."""
    environ = os.environ if environ is None else environ
    configured = environ.get(CACHE_ENV)
    return Path(configured).resolve() if configured else repo_root / ".cache" / "fallback-matrix"


def artifacts_root(repo_root: Path) -> Path:
    return repo_root / "artifacts"
