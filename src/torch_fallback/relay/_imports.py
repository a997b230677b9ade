"""Work that waits for a module relay adapts but does not need to import itself."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import types
from collections.abc import Callable
from typing import Any


class OnImport(importlib.abc.MetaPathFinder):
    """Calls `then(module)` once the module `name` has been first imported and run.

    It leaves sys.meta_path only then: a look for the module that imports nothing
    (importlib.util.find_spec) leaves it waiting for the import."""

    def __init__(self, name: str, then: Callable[[types.ModuleType], None]) -> None:
        self.name, self.then = name, then
        self._finding = False

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != self.name or self._finding:
            return None
        self._finding = True  # the module's spec, as the other finders give it
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            load(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
                self.then(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def when_imported(name: str, then: Callable[[types.ModuleType], None]) -> None:
    """`then(module)` now if the module `name` is imported already, else once it is."""
    module = sys.modules.get(name)
    if module is not None:
        then(module)
        return
    waiting = any(
        isinstance(finder, OnImport) and finder.name == name and finder.then == then
        for finder in sys.meta_path
    )
    if not waiting:
        sys.meta_path.insert(0, OnImport(name, then))
