"""Real models trained for a few optimizer steps, and the eager reference runner.

The training tests train each model on relay in the test process and compare it
with the same model trained eagerly on the fallback's target device. The eager
run happens in a child process, ``python reference_runner.py IN OUT``, that never
imports torch_fallback: once a PrivateUse1 backend is registered, CUDA autograd
in PyTorch itself misbehaves (pytorch/pytorch#161129), so an in-process CUDA
reference could not be trusted. The child rebuilds the model, loads the initial
state dict and the inputs from IN (``torch.save``), trains on the device named
there and writes the results to OUT.

This module imports only torch, so both processes can share the models and the
training loop.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

STEPS = 3
DTYPE = torch.float64


class SmallCNN(nn.Module):
    """conv, BatchNorm, ReLU, max and adaptive average pooling, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


class Recurrent(nn.Module):
    """nn.LSTM (two layers), nn.GRU (bidirectional), then LSTMCell and GRUCell over time."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 6, num_layers=2, batch_first=True)
        self.gru = nn.GRU(6, 3, batch_first=True, bidirectional=True)
        self.lstm_cell = nn.LSTMCell(6, 5)
        self.gru_cell = nn.GRUCell(5, 5)
        self.head = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        h = c = g = y.new_zeros(y.shape[0], 5)
        for t in range(y.shape[1]):
            h, c = self.lstm_cell(y[:, t], (h, c))
            g = self.gru_cell(h, g)
        return self.head(g)


class Encoder(nn.Module):
    """nn.TransformerEncoder (batch first, no dropout) with a pooled linear head."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(x, src_key_padding_mask=mask)

    def predict(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keep = (~mask).unsqueeze(-1).to(x.dtype)
        pooled = (self(x, mask) * keep).sum(1) / keep.sum(1)
        return self.head(pooled)


class Bags(nn.Module):
    """nn.EmbeddingBag (mean of each bag, dense or sparse gradient) and a linear head."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(30, 8, mode="mean", sparse=sparse)
        self.head = nn.Linear(8, 2)

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(indices, offsets))


class Decoder(nn.Module):
    """conv, GroupNorm, GELU, transposed conv, bilinear upsampling, LayerNorm, a residual."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.mix = nn.Conv2d(4, 3, 1)
        self.layer_norm = nn.LayerNorm(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.gelu(self.norm(self.down(x)))
        y = self.mix(self.up(y)) + F.interpolate(
            F.avg_pool2d(x, 2), scale_factor=2.0, mode="bilinear", align_corners=False
        )
        return self.layer_norm(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Mlp(nn.Module):
    """Linear layers with SiLU and a log-softmax head: the optimizer cases' model."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(6, 16), nn.SiLU(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.head(self.layers(x)), dim=-1)


# Optimizer cases: the MLP trained by each, foreach or fused as a user would pick.
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw-amsgrad-clipped": lambda p: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, foreach=True),
    "adam-fused": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=1e-3, fused=True),
    "sgd-nesterov": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3, foreach=True
    ),
    "rmsprop-centered": lambda p: torch.optim.RMSprop(
        p, lr=1e-2, centered=True, momentum=0.5, foreach=True
    ),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-1, lr_decay=1e-2, foreach=True),
    "nadam": lambda p: torch.optim.NAdam(p, lr=1e-2, foreach=True),
    "radam": lambda p: torch.optim.RAdam(
        p, lr=1e-2, decoupled_weight_decay=True, weight_decay=1e-2, foreach=True
    ),
    "adamax": lambda p: torch.optim.Adamax(p, lr=1e-2, foreach=True),
}


# Cases that clip the gradients (clip_grad_norm_, foreach) before each optimizer step.
CLIPPED = ("decoder", "mlp-adamw-amsgrad-clipped")


def build(name: str) -> nn.Module:
    """The model of a case, float64, weights from the current RNG state."""
    models: dict[str, Callable[[], nn.Module]] = {
        "cnn": SmallCNN,
        "recurrent": Recurrent,
        "transformer": Encoder,
        "embedding_bag": lambda: Bags(sparse=False),
        "embedding_bag_sparse": lambda: Bags(sparse=True),
        "decoder": Decoder,
        **{f"mlp-{optimizer}": Mlp for optimizer in OPTIMIZERS},
    }
    return models[name]().to(DTYPE)


def make_case(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """The model (on the CPU, fixed seed) and its inputs: one batch per step plus eval inputs."""
    torch.manual_seed(0)
    model = build(name)
    gen = torch.Generator().manual_seed(1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=DTYPE)

    if name == "cnn":
        batches = [
            (randn(4, 3, 8, 8), torch.randint(0, 5, (4,), generator=gen)) for _ in range(STEPS)
        ]
        return model, {"batches": batches, "eval": (randn(3, 3, 8, 8),)}
    if name == "recurrent":
        batches = [(randn(3, 5, 4), randn(3, 2)) for _ in range(STEPS)]
        return model, {"batches": batches, "eval": (randn(2, 5, 4),)}
    if name == "transformer":
        mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
        batches = [(randn(3, 5, 16), mask, randn(3, 3)) for _ in range(STEPS)]
        return model, {"batches": batches, "eval": (randn(3, 5, 16), mask)}
    if name == "decoder":
        batches = [(randn(2, 3, 8, 8), randn(2, 3, 8, 8)) for _ in range(STEPS)]
        return model, {"batches": batches, "eval": (randn(1, 3, 8, 8),)}
    if name.startswith("mlp-"):
        batches = [(randn(5, 6), torch.randint(0, 4, (5,), generator=gen)) for _ in range(STEPS)]
        return model, {"batches": batches, "eval": (randn(2, 6),)}
    if name.startswith("embedding_bag"):
        offsets = torch.tensor([0, 3, 4, 8])
        batches = [
            (torch.randint(0, 30, (10,), generator=gen), offsets, randn(4, 2)) for _ in range(STEPS)
        ]
        return model, {"batches": batches, "eval": (torch.tensor([1, 2, 29, 7, 7]), offsets[:2])}
    raise ValueError(f"unknown case {name!r}")


def _to(value: Any, device: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _cpu(value: torch.Tensor) -> torch.Tensor:
    return value.detach().to("cpu", copy=True)


def _optimizer(name: str, model: nn.Module) -> torch.optim.Optimizer:
    if name.startswith("mlp-"):
        return OPTIMIZERS[name.removeprefix("mlp-")](model.parameters())
    if name == "decoder":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    if name == "recurrent" or name == "transformer":
        return torch.optim.Adam(model.parameters(), lr=1e-2)
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _loss(name: str, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    if name == "cnn":
        x, target = batch
        return F.cross_entropy(model(x), target)
    if name.startswith("mlp-"):
        x, target = batch
        return F.nll_loss(model(x), target)
    if name == "decoder":
        x, target = batch
        return F.smooth_l1_loss(model(x), target)
    if name == "recurrent":
        x, target = batch
        return F.mse_loss(model(x), target)
    if name == "transformer":
        x, mask, target = batch
        return F.mse_loss(model.predict(x, mask), target)
    indices, offsets, target = batch
    return F.mse_loss(model(indices, offsets), target)


def _eval_outputs(name: str, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict:
    model.eval()
    with torch.no_grad():
        if name == "transformer":
            # eval mode, no grad, batch first, a padding mask: the nested-tensor fast path
            x, mask = inputs
            return {
                "encoder(mask)": _cpu(model(x, mask)),
                "predict(mask)": _cpu(model.predict(x, mask)),
                "encoder": _cpu(model.encoder(x)),
            }
        return {"output": _cpu(model(*inputs))}


def train(name: str, model: nn.Module, inputs: dict[str, Any], device: str) -> dict[str, Any]:
    """STEPS optimizer steps on `device` in train mode, then eval outputs; results on the CPU."""
    model.to(device)
    model.train()
    optimizer = _optimizer(name, model)
    losses = []
    for batch in inputs["batches"]:
        optimizer.zero_grad()
        loss = _loss(name, model, _to(batch, device))
        loss.backward()
        if name in CLIPPED:
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5, foreach=True)
        optimizer.step()
        losses.append(_cpu(loss))
    devices = {p.device.type for p in model.parameters()}
    devices |= {b.device.type for b in model.buffers()}
    return {
        "devices": sorted(devices),
        "losses": losses,
        "parameters": {n: _cpu(p) for n, p in model.named_parameters()},
        "buffers": {n: _cpu(b) for n, b in model.named_buffers()},
        "eval": _eval_outputs(name, model, _to(inputs["eval"], device)),
        "torch_fallback_imported": "torch_fallback" in sys.modules,
    }


def run_reference(
    name: str, model: nn.Module, inputs: dict[str, Any], device: str, workdir: Path
) -> dict[str, Any]:
    """Train a copy of `model` eagerly on `device` in a process without torch_fallback."""
    request, result = workdir / f"{name}-{device}-in.pt", workdir / f"{name}-{device}-out.pt"
    torch.save(
        {"name": name, "state": model.state_dict(), "inputs": inputs, "device": device}, request
    )
    # A torch_fallback installed with a device-backend entry point must not load itself.
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    completed = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(request), str(result)],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=300,
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"eager reference for {name} on {device} exited with {completed.returncode}:\n"
            f"{completed.stderr[-4000:]}"
        )
    reference = torch.load(result, weights_only=False)
    assert not reference["torch_fallback_imported"], "the reference process imported torch_fallback"
    return reference


def _main(request: str, result: str) -> None:
    payload = torch.load(request, weights_only=False)
    name, device = payload["name"], payload["device"]
    model = build(name)
    model.load_state_dict(payload["state"])
    torch.save(train(name, model, payload["inputs"], device), result)


if __name__ == "__main__":
    _main(*sys.argv[1:])
