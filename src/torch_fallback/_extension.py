"""The loaded library, torch_fallback._C (see _loader for the load order).

Its functions are operators: ``ops`` is ``torch.ops.torch_fallback``.
"""

from __future__ import annotations

import torch

from ._loader import load_extension

_C = load_extension()
ops = torch.ops.torch_fallback
