"""`import torch_fallback` changes nothing else in torch; only `import torch_fallback.relay`
registers a device.

Each probe runs in a fresh interpreter, once with plain torch and once after
the import under test, and the two must agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    if sys.argv[1]:
        __import__(sys.argv[1])

    def outcome(fn):
        try:
            return repr(fn())
        except Exception as error:  # the error is part of the behaviour
            return type(error).__name__

    def freeze_rng_state_works():
        with torch.testing._utils.freeze_rng_state():
            return torch.rand(2).shape

    print(json.dumps({
        "privateuse1_name": torch._C._get_privateuse1_backend_name(),
        "accelerator": outcome(torch.accelerator.current_accelerator),
        "pinned": outcome(lambda: torch.randn(8).pin_memory().is_pinned()),
        "freeze_rng_state": outcome(freeze_rng_state_works),
        "has_torch_relay": hasattr(torch, "relay"),
        "relay_device": outcome(lambda: torch.empty(1, device="relay").device),
    }))
    """
)


def probe(module: str) -> dict[str, object]:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, module], capture_output=True, text=True, check=True
    )
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_importing_the_library_changes_no_torch_global():
    assert probe("torch_fallback") == probe("")


def test_importing_relay_overrides_no_kernel():
    # The dispatcher warns (on stderr) when a registration replaces another: the
    # ops the library runs whole must leave relay's own kernels alone.
    completed = subprocess.run(
        [sys.executable, "-c", "import torch_fallback.relay"], capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr
    assert "Overriding a previously registered kernel" not in completed.stderr, completed.stderr


def test_importing_relay_registers_the_device():
    plain, with_relay = probe(""), probe("torch_fallback.relay")
    assert plain["privateuse1_name"] == "privateuseone"
    assert with_relay["privateuse1_name"] == "relay"
    assert with_relay["has_torch_relay"] is True
    assert with_relay["relay_device"] == "device(type='relay', index=0)"
    assert with_relay["freeze_rng_state"] == plain["freeze_rng_state"]
    assert with_relay["pinned"] == "True"


@pytest.mark.requires_cuda
def test_native_cuda_training_works_after_importing_the_library():
    script = textwrap.dedent(
        """
        import torch, torch_fallback
        x = torch.randn(4, device="cuda", requires_grad=True)
        (x * 2).sum().backward()
        print(x.grad.tolist())
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == str([2.0] * 4)
    assert torch.cuda.is_available()
