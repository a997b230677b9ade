"""Moving a module to relay and back keeps its parameters as a move between CPU and CUDA does.

nn.Module._apply keeps a parameter object (``param.data = moved``) only when
``torch._has_compatible_shallow_copy_type(param, moved)`` holds; otherwise it makes a
new Parameter per module, and weights shared by two modules come apart. The
reference for every structure below is the same move between two dense types
(CPU float32 -> float64 here, CPU -> CUDA on a GPU), which PyTorch keeps in place.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch
from torch import nn

import torch_fallback.relay  # noqa: F401  (registers the relay device)

Move = Callable[[nn.Module], nn.Module]


class TiedLM(nn.Module):
    """An embedding tied to the output head, the shape of GPT-2, T5, BART and BERT-MLM."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.Tanh())
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.embed(ids)))


class SharedLayers(nn.Module):
    """One block reused at several depths (ALBERT), a parameter tied across nesting
    levels, and a buffer registered in two modules."""

    def __init__(self) -> None:
        super().__init__()
        block = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        self.layers = nn.ModuleList([block, nn.Sequential(block, nn.ReLU()), block])
        self.outer = nn.ModuleDict({"inner": nn.ModuleDict({"proj": nn.Linear(4, 4)})})
        self.outer["inner"]["proj"].weight = self.layers[0][0].weight
        scale = torch.ones(4)
        self.register_buffer("scale", scale)
        self.layers[0][1].register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) * self.scale
        return self.outer["inner"]["proj"](x)


MODELS: dict[str, Callable[[], nn.Module]] = {"tied-lm": TiedLM, "shared-layers": SharedLayers}

# Each move on relay, and the same move between dense types PyTorch keeps in place.
MOVES: dict[str, tuple[Move, Move]] = {
    "to(device)": (lambda m: m.to("relay"), lambda m: m.to(torch.float64)),
    "to(device) and back": (lambda m: m.to("relay").to("cpu"), lambda m: m.double().float()),
    "to(device, dtype)": (lambda m: m.to("relay", torch.float64), lambda m: m.to(torch.float64)),
    "to(device) then to(dtype)": (
        lambda m: m.to("relay").to(torch.float64),
        lambda m: m.to(torch.float64).to(torch.float16),
    ),
    "relay()": (lambda m: m.relay(), lambda m: m.double()),
    "to(torch.device)": (lambda m: m.to(torch.device("relay", 0)), lambda m: m.double()),
}


def structure(model: nn.Module, before: dict[str, torch.Tensor]) -> dict[str, object]:
    """Which names share one tensor object, and which objects survived the move."""

    def groups(named: list[tuple[str, torch.Tensor]]) -> list[list[str]]:
        by_object: dict[int, list[str]] = {}
        for name, tensor in named:
            by_object.setdefault(id(tensor), []).append(name)
        return sorted(by_object.values())

    params = list(model.named_parameters(remove_duplicate=False))
    buffers = list(model.named_buffers(remove_duplicate=False))
    return {
        "parameter groups": groups(params),
        "buffer groups": groups(buffers),
        "kept objects": sorted(name for name, t in params + buffers if before.get(name) is t),
        "grad groups": groups([(n, p.grad) for n, p in params if p.grad is not None]),
    }


def names_to_objects(model: nn.Module) -> dict[str, torch.Tensor]:
    named = [*model.named_parameters(remove_duplicate=False)]
    return dict([*named, *model.named_buffers(remove_duplicate=False)])


def make(model_name: str, grads: bool) -> nn.Module:
    """The model (fixed seed), after a backward pass with `grads`, so moves carry .grad too
    (deepcopy would drop them)."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    if grads:
        inputs = torch.tensor([1, 2, 3]) if isinstance(model, TiedLM) else torch.randn(3, 4)
        model(inputs).sum().backward()
    return model


@pytest.mark.parametrize("grads", [False, True], ids=["no-grad", "grad"])
@pytest.mark.parametrize("move", sorted(MOVES))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_a_move_keeps_the_structure_a_dense_move_keeps(model_name, move, grads):
    relay_move, dense_move = MOVES[move]
    model, reference = make(model_name, grads), make(model_name, grads)
    reference_before, before = names_to_objects(reference), names_to_objects(model)
    expected = structure(dense_move(reference), reference_before)
    got = structure(relay_move(model), before)
    assert got == expected
    # A parameter kept in place really moved: no tensor was left behind.
    expected_type = "cpu" if move == "to(device) and back" else "relay"
    assert {t.device.type for t in names_to_objects(model).values()} == {expected_type}


def test_the_tie_of_the_issue_survives_to_relay():
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = nn.ModuleDict({"emb": emb, "head": head}).to("relay")
    assert m["emb"].weight is m["head"].weight
    assert len(list(m.parameters())) == 1


@pytest.mark.parametrize("built", ["before", "after"])
def test_an_optimizer_trains_the_tied_model_as_eager_does(placement, built):
    torch.manual_seed(0)
    model = TiedLM().double()
    reference = copy.deepcopy(model)
    ids = torch.tensor([[1, 2, 3], [4, 5, 9]])

    def train(m: nn.Module, device: str) -> list[float]:
        optimizer = torch.optim.AdamW(m.parameters(), lr=0.1) if built == "before" else None
        m.to(device)
        optimizer = optimizer or torch.optim.AdamW(m.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = m(ids.to(device)).logsumexp(-1).mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    expected = train(reference, "cpu")
    got = train(model, "relay")
    assert got == pytest.approx(expected, rel=1e-12)
    assert model.head.weight is model.embed.weight
    torch.testing.assert_close(model.embed.weight.cpu(), reference.embed.weight)


@pytest.mark.parametrize("assign", [False, True])
def test_load_state_dict_after_the_move_keeps_ties(placement, assign):
    torch.manual_seed(0)
    source = TiedLM().double()
    model = TiedLM().double().to("relay")
    dense = TiedLM().double()
    model.load_state_dict(source.state_dict(), assign=assign)
    dense.load_state_dict(source.state_dict(), assign=assign)
    assert (model.head.weight is model.embed.weight) == (dense.head.weight is dense.embed.weight)
    assert model.embed.weight.device.type == "relay" or assign
    torch.testing.assert_close(model.head.weight.cpu(), source.embed.weight)

    # The state dict of the moved model names one memory twice, as eager's does.
    def shares(state: dict[str, torch.Tensor]) -> bool:
        return state["head.weight"].data_ptr() == state["embed.weight"].data_ptr()

    assert shares(model.state_dict()) == shares(dense.state_dict())


def test_a_moved_parameter_keeps_its_version_counter_and_autograd_identity():
    param = nn.Parameter(torch.randn(3))
    module = nn.Linear(3, 1)
    module.weight = nn.Parameter(param.detach().unsqueeze(0).clone())
    module.to("relay")
    assert module.weight.is_leaf and module.weight.requires_grad
    module(torch.ones(1, 3, device="relay")).sum().backward()
    assert module.weight.grad.device.type == "relay"
    with torch.no_grad():
        version = module.weight._version
        module.weight.add_(1)
    assert module.weight._version == version + 1


PAIRS_PROBE = textwrap.dedent(
    """
    import json, sys
    import torch
    if sys.argv[1]:
        __import__(sys.argv[1])
    make = {
        "cpu": lambda: torch.ones(2),
        "cpu-f64": lambda: torch.ones(2, dtype=torch.float64),
        "meta": lambda: torch.ones(2, device="meta"),
        "sparse": lambda: torch.ones(2).to_sparse(),
        "quantized": lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
        "nested": lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
    }
    print(json.dumps({
        f"{a}->{b}": torch._has_compatible_shallow_copy_type(make[a](), make[b]())
        for a in make for b in make
    }))
    """
)


def test_moves_of_tensors_of_other_devices_are_answered_as_before_the_import():
    def answers(module: str) -> dict[str, bool]:
        completed = subprocess.run(
            [sys.executable, "-c", PAIRS_PROBE, module], capture_output=True, text=True, check=True
        )
        return json.loads(completed.stdout.strip().splitlines()[-1])

    plain = answers("")
    assert plain == answers("torch_fallback.relay")
    assert plain["cpu->cpu-f64"] and not plain["cpu->meta"]  # the probe sees both answers


@pytest.mark.parametrize("other", ["meta", "sparse"])
def test_relay_does_not_swap_memory_with_what_cpu_would_not(other):
    relay = torch.ones(2, device="relay")
    target = torch.ones(2, device="meta") if other == "meta" else torch.ones(2).to_sparse()
    cpu_answer = torch._has_compatible_shallow_copy_type(torch.ones(2), target)
    assert torch._has_compatible_shallow_copy_type(relay, target) == cpu_answer is False
    with pytest.raises(RuntimeError, match="incompatible tensor type"):
        relay.data = target


@pytest.mark.requires_cuda
@pytest.mark.parametrize("move", sorted(MOVES))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_a_move_keeps_the_structure_a_move_to_cuda_keeps(model_name, move):
    relay_move, _ = MOVES[move]
    model, reference = make(model_name, grads=True), make(model_name, grads=True)
    reference_before, before = names_to_objects(reference), names_to_objects(model)
    moved_on_cuda = relay_move(_RelayAsCuda(reference)).module  # type: ignore[arg-type]
    expected = structure(moved_on_cuda, reference_before)
    got = structure(relay_move(model), before)
    assert got == expected


class _RelayAsCuda:
    """Replays a relay move on CUDA: the same calls, "relay" read as "cuda"."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def to(self, *args, **kwargs):
        def swap(value):
            if value == "relay":
                return "cuda"
            if isinstance(value, torch.device) and value.type == "relay":
                return torch.device("cuda", value.index)
            return value

        self.module = self.module.to(*map(swap, args), **kwargs)
        return self

    def relay(self):
        self.module = self.module.cuda()
        return self

    def __getattr__(self, name):
        return getattr(self.module, name)
