"""relay's backward on the thread that calls backward().

PyTorch's autograd engine runs relay's backward on a thread of its own; docs/relay.md
recommends torch.autograd.set_multithreading_enabled(False) for training on the CPU
target, where that thread's OpenMP team slows the main thread's. Training with it must
run the backward on the calling thread and train as the engine's thread does.
"""

from __future__ import annotations

import copy
import threading

import torch
from torch import nn

import torch_fallback.relay  # noqa: F401  (registers the relay device)

STEPS = 3
# float64; CUDA's backward kernels add in no fixed order (atomics), as in test_training
RTOL, ATOL = 1e-7, 1e-9


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.GELU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(8), nn.Linear(8, 5),
    ).double()  # fmt: skip


def train(model: nn.Module, calling_thread: bool) -> tuple[list[torch.Tensor], set[int]]:
    """STEPS AdamW steps on relay; the losses and the threads the backward ran on."""
    torch.manual_seed(1)
    inputs = torch.randn(4, 3, 12, 12, dtype=torch.double).to("relay")
    labels = torch.randint(0, 5, (4,)).to("relay")
    model = model.to("relay")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    losses, threads = [], set()
    with torch.autograd.set_multithreading_enabled(not calling_thread):
        for _ in range(STEPS):
            optimizer.zero_grad()
            logits = model(inputs)
            logits.register_hook(lambda grad: threads.add(threading.get_ident()))
            loss = nn.functional.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().cpu())
    return losses, threads


def test_backward_on_the_calling_thread_trains_as_on_the_engines_thread(placement):
    model = make_model()
    on_engine = copy.deepcopy(model)
    on_caller = copy.deepcopy(model)
    engine_losses, engine_threads = train(on_engine, calling_thread=False)
    caller_losses, caller_threads = train(on_caller, calling_thread=True)

    main = threading.get_ident()
    assert len(engine_threads) == 1 and main not in engine_threads, (
        "the engine ran relay's backward on the calling thread: docs/relay.md's "
        "'Training on the CPU' no longer describes this PyTorch"
    )
    assert caller_threads == {main}, "set_multithreading_enabled(False) left the calling thread"
    torch.testing.assert_close(caller_losses, engine_losses, rtol=RTOL, atol=ATOL)
    engine_state = {k: v.cpu() for k, v in on_engine.state_dict().items()}
    caller_state = {k: v.cpu() for k, v in on_caller.state_dict().items()}
    torch.testing.assert_close(caller_state, engine_state, rtol=RTOL, atol=ATOL)
    assert not torch.equal(caller_state["0.weight"], model.state_dict()["0.weight"])
