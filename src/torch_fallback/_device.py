"""Registers relay: PrivateUse1 renamed, with its device module and methods."""

from __future__ import annotations

from types import ModuleType

import torch

NAME = "relay"


def register(device_module: ModuleType) -> None:
    """Make `relay` a torch device; idempotent within a process."""
    if torch._C._get_privateuse1_backend_name() != NAME:
        torch.utils.rename_privateuse1_backend(NAME)
    if not hasattr(torch, NAME):
        torch._register_device_module(NAME, device_module)
    if not hasattr(torch.Tensor, NAME):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )
