"""What a cell installs besides torch, read from pyproject.toml's [dependency-groups].

pyproject.toml stays the one list of build and test requirements; this module
only reads it (PEP 735, including ``{include-group = "..."}`` entries).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from .errors import ProjectFileError

CELL_GROUPS: tuple[str, ...] = ("build", "test")


def _expand_group(
    groups: Mapping[str, Any], name: str, file: Path, seen: tuple[str, ...] = ()
) -> list[str]:
    if name in seen:
        chain = " -> ".join((*seen, name))
        raise ProjectFileError(
            f"{file}: [dependency-groups] include cycle: {chain}; remove one include"
        )
    entries = groups.get(name)
    if not isinstance(entries, list):
        raise ProjectFileError(
            f"{file}: [dependency-groups] has no list named {name!r}; a cell installs the groups "
            f'{", ".join(CELL_GROUPS)}: add it, e.g. {name} = ["pytest>=8"]'
        )
    requirements: list[str] = []
    for entry in entries:
        if isinstance(entry, str):
            requirements.append(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("include-group"), str):
            requirements += _expand_group(groups, entry["include-group"], file, (*seen, name))
        else:
            raise ProjectFileError(
                f"{file}: [dependency-groups].{name} has an entry {entry!r}; "
                "expected a requirement "
                'string or {include-group = "NAME"}'
            )
    return requirements


def dependency_groups(pyproject: Path, names: Sequence[str] = CELL_GROUPS) -> tuple[str, ...]:
    """The requirements of the named groups, in order, without duplicates."""
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProjectFileError(
            f"{pyproject} not found; fallback_matrix reads the cells' build and test "
            "requirements from its [dependency-groups]"
        ) from None
    except tomllib.TOMLDecodeError as error:
        raise ProjectFileError(f"{pyproject} is not valid TOML: {error}") from None
    groups = data.get("dependency-groups")
    if not isinstance(groups, dict):
        raise ProjectFileError(
            f"{pyproject} has no [dependency-groups] table; add groups {', '.join(names)} "
            "listing what a cell installs besides torch"
        )
    requirements: list[str] = []
    for name in names:
        requirements += _expand_group(groups, name, pyproject)
    return tuple(dict.fromkeys(requirements))
