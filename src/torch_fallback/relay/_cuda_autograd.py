"""relay beside native CUDA autograd.

Once a PrivateUse1 backend registers its hooks, PyTorch takes it as the
process's accelerator, and the autograd engine then finds no stream for CUDA
nodes: every native CUDA backward fails with an internal assert
("opt_ready_stream && opt_parent_stream", pytorch/pytorch#161129). Nothing a
backend can register avoids it, so relay turns that assert into an error that
says what happened and what to do.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.autograd
import torch.autograd.graph

ENGINE_ASSERT = "opt_ready_stream && opt_parent_stream"
MESSAGE = (
    "torch_fallback: native CUDA autograd cannot run in a process where the relay device is "
    "registered: PyTorch takes relay as the accelerator, and its autograd engine then has no "
    "stream for CUDA nodes (pytorch/pytorch#161129). Run CUDA training in a process that does "
    "not import torch_fallback.relay (importing torch_fallback alone is fine)."
)


def _explained(run_backward: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_backward)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return run_backward(*args, **kwargs)
        except RuntimeError as error:
            if ENGINE_ASSERT in str(error):
                raise RuntimeError(MESSAGE) from error
            raise

    run.__wrapped_by_relay__ = True  # type: ignore[attr-defined]
    return run


def install() -> None:
    """Explain the engine's assert wherever Python code starts a backward pass."""
    if not torch.backends.cuda.is_built():
        return
    original = torch.autograd.graph._engine_run_backward
    if getattr(original, "__wrapped_by_relay__", False):
        return
    wrapped = _explained(original)
    torch.autograd.graph._engine_run_backward = wrapped
    torch.autograd._engine_run_backward = wrapped
