"""A setting changed for the duration of a with-block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def scoped(get: Callable[[], str], set_: Callable[[str], None], value: str) -> Iterator[None]:
    previous = get()
    set_(value)
    try:
        yield
    finally:
        set_(previous)
