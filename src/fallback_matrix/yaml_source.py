"""Read YAML strictly, and remember where every key came from.

PyYAML's safe loader silently keeps the last of two equal keys and reports no
positions once data is built. This module rejects duplicate keys and keeps a
map from key paths (``("cells", 1, "torch")``) to line numbers, so validation
errors can point at the line to fix.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KeyPath = tuple[str | int, ...]


class YamlSyntaxError(Exception):
    """The text is not valid YAML (or repeats a key); the message names the line."""

    def __init__(self, message: str, line: int | None) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True)
class YamlDocument:
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, path: KeyPath) -> int | None:
        """Line of the deepest prefix of ``path`` that the document knows."""
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return None


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Hashable, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise YamlSyntaxError(
                    f"key {key!r} appears twice (lines {seen[key]} and {line}); keep one", line
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _index_lines(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            child = (*path, str(key_node.value))
            _index_lines(value_node, child, lines)
            lines[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, (*path, index), lines)


def parse_yaml(text: str) -> YamlDocument:
    """Parse one YAML document; raise YamlSyntaxError with a line number when it is invalid."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = mark.line + 1 if mark is not None else None
        column = f", column {mark.column + 1}" if mark is not None else ""
        problem = error.problem or error.context or "invalid YAML"
        raise YamlSyntaxError(f"invalid YAML{column}: {problem}", line) from None
    except yaml.YAMLError as error:
        raise YamlSyntaxError(f"invalid YAML: {error}", None) from None
    lines: dict[KeyPath, int] = {}
    if node is not None:
        _index_lines(node, (), lines)
    return YamlDocument(data=data, lines=lines)


def read_yaml(path: Path) -> YamlDocument:
    return parse_yaml(path.read_text(encoding="utf-8"))
