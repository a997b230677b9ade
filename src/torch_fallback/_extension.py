"""The loaded library, torch_fallback._C (see _loader for the load order)."""

from __future__ import annotations

from ._loader import load_extension

_C = load_extension()
