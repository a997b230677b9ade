"""torch-fallback: a generalized boxed fallback for out-of-tree PyTorch backends.

Importing it loads the extension (choosing how the c10::cuda symbols resolve),
registers the relay device, and applies the TORCH_FALLBACK_* environment.
"""

from __future__ import annotations

import torch  # noqa: F401  (loads libtorch before the extension)

from . import relay
from ._device import register as _register_device
from .metrics import OpMetrics, metrics, metrics_report, reset_metrics
from .settings import (
    apply_environment,
    get_cpu_ops,
    get_cuda_sync,
    get_target,
    set_cpu_ops,
    set_cuda_sync,
    set_target,
    target,
)

_register_device(relay)
apply_environment()

get_relay_home = relay.get_home
set_relay_home = relay.set_home
relay_home = relay.home

__version__ = "0.1.0"

__all__ = [
    "OpMetrics",
    "get_cpu_ops",
    "get_cuda_sync",
    "get_relay_home",
    "get_target",
    "metrics",
    "metrics_report",
    "relay",
    "relay_home",
    "reset_metrics",
    "set_cpu_ops",
    "set_cuda_sync",
    "set_relay_home",
    "set_target",
    "target",
]
