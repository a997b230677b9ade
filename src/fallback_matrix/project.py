"""What a cell installs besides torch: dependency groups of pyproject.toml (PEP 735).

pip resolves them itself (``pip download/install --group PATH:NAME``, pip >= 25.1);
this module only checks that the groups exist and gives their table as canonical
JSON, which keys a wheelhouse: change a group, get a new wheelhouse.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import tomllib

from .errors import ProjectFileError

CELL_GROUPS: tuple[str, ...] = ("build", "test")


def dependency_groups(pyproject: Path, names: Sequence[str] = CELL_GROUPS) -> str:
    """pyproject's [dependency-groups] as canonical JSON, after checking ``names`` exist."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProjectFileError(
            f"{pyproject} not found; a cell installs its [dependency-groups] "
            f"{', '.join(names)} besides torch"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise ProjectFileError(f"{pyproject} is not valid TOML: {error}") from None
    groups = data.get("dependency-groups")
    missing = [name for name in names if not isinstance((groups or {}).get(name), list)]
    if not isinstance(groups, dict) or missing:
        raise ProjectFileError(
            f"{pyproject}: [dependency-groups] lacks {', '.join(missing or names)}; a cell "
            f'installs the groups {", ".join(names)} besides torch, e.g. test = ["pytest>=8"]'
        )
    return json.dumps(groups, sort_keys=True)


def group_args(pyproject: Path | str, names: Sequence[str] = CELL_GROUPS) -> list[str]:
    """pip options installing the groups ``names`` of ``pyproject``."""
    return [f"--group={pyproject}:{name}" for name in names]
