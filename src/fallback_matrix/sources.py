"""Which files of the repository a cell copies into its build directory.

In a git checkout: the tracked files plus untracked ones git does not ignore
(so build outputs, caches and artifacts never reach the build). Elsewhere: a
walk that skips the usual generated directories.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".cache",
        ".nox",
        ".venv",
        "artifacts",
        "build",
        "dist",
        "__pycache__",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
    }
)


def _git_files(repo: Path) -> list[str] | None:
    try:
        result = subprocess.run(
            [
                "git",
                "-C",
                str(repo),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=False,
        )
    except FileNotFoundError:
        return None
    if result.returncode != 0:
        return None
    return [name for name in result.stdout.decode().split("\0") if name]


def _walked_files(repo: Path) -> list[str]:
    found = []
    for directory, subdirs, files in os.walk(repo):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        base = Path(directory).relative_to(repo)
        found += [str(base / name) for name in files if not name.endswith((".so", ".pyc"))]
    return found


def source_files(repo: Path) -> tuple[str, ...]:
    """Repository-relative paths of the files a build needs, sorted."""
    names = _git_files(repo)
    if names is None:
        names = _walked_files(repo)
    return tuple(sorted(name for name in set(names) if (repo / name).is_file()))
