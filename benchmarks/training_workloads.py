"""The measured side of training_bench.py: one process, native or relay.

`python benchmarks/training_bench.py --side native|relay ...` serves the parent
from here: plan() lists the side's measurements, measure() runs one of them. The
native side never imports torch_fallback (a registered PrivateUse1 backend breaks
native CUDA autograd, pytorch/pytorch#161129); the relay side imports
torch_fallback.relay and sets the fallback target and the relay home per
measurement. Each measurement is one row: {"kind", "name", "config", "ref", ...},
where a relay row's "ref" names the native config it is compared with.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import torch
from harness import fallback_calls, no_sync, time_calls
from torch import nn

# (model, small?) -> sizes. The full sizes are the issue's; --small is for CPU hosts.
CNN = {False: dict(batch=64, side=64, width=64), True: dict(batch=8, side=32, width=16)}
TRANSFORMER = {
    False: dict(batch=32, seq=128, d=512, heads=8, layers=6),
    True: dict(batch=8, seq=32, d=128, heads=4, layers=2),
}
PER_OP_CALLS = 100  # calls per sample of the throughput figure
CROSS_HOME = [  # (op, size) from fallback_bench, the cross-home list first
    ("add", "1K"), ("sort", "1M"), ("nonzero", "1M"), ("cumsum", "16M"), ("unique", "1M"),
    ("add", "1M"), ("cumsum", "1M"), ("median", "1M"), ("repeat_interleave", "1M"),
    ("embedding_bag", "1M"), ("scatter_reduce_mean", "1M"), ("cdist", "1M"),
]  # fmt: skip
SIZES = {"1K": 1 << 10, "1M": 1 << 20, "16M": 1 << 24}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def slice_budget(args) -> float:
    """Seconds for one measurement of a kind training_bench pairs in slices: its share
    of --budget (tools without --slices measure in one)."""
    return args.budget / getattr(args, "slices", 1)


def make_sync(uses_cuda: bool) -> Callable[[], None]:
    return torch.cuda.synchronize if uses_cuda else no_sync


# Training steps.


def cnn(small: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    s = CNN[small]
    w = s["width"]
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate([(3, w), (w, w), (w, 2 * w), (2 * w, 2 * w)]):
        layers += [nn.Conv2d(cin, cout, 3, stride=1 if i == 0 else 2, padding=1, bias=False),
                   nn.BatchNorm2d(cout), nn.ReLU()]  # fmt: skip
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * w, 10))
    inputs = torch.randn(s["batch"], 3, s["side"], s["side"])
    return model, inputs, torch.randint(0, 10, (s["batch"],))


class Encoder(nn.Module):
    def __init__(self, d: int, heads: int, layers: int) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def transformer(small: bool) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    s = TRANSFORMER[small]
    model = Encoder(s["d"], s["heads"], s["layers"])
    inputs = torch.randn(s["batch"], s["seq"], s["d"])
    return model, inputs, torch.randint(0, 10, (s["batch"],))


MODELS = {"cnn": cnn, "transformer": transformer}


def train_step(spec: dict, args, sync: Callable[[], None]) -> tuple[dict, Callable[..., None]]:
    torch.manual_seed(0)
    model, inputs, labels = MODELS[spec["name"]](args.small)
    device = spec["device"]
    model = model.to(device).train()
    inputs, labels = inputs.to(device), labels.to(device)
    # foreach pinned: relay would default to it, native CPU would not.
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    low = spec["dtype"] == "bf16"

    def step(marks: list[float] | None = None) -> None:
        """One step; `marks` (step_profile's phases) gets a time after each phase."""
        mark = marks.append if marks is not None else (lambda _: None)
        optimizer.zero_grad(set_to_none=True)
        mark(time.perf_counter())
        with torch.autocast(device, dtype=torch.bfloat16, enabled=low):
            loss = nn.functional.cross_entropy(model(inputs), labels)
        mark(time.perf_counter())
        loss.backward()
        mark(time.perf_counter())
        optimizer.step()
        mark(time.perf_counter())

    timed = time_calls(step, sync, slice_budget(args), max_repeats=200)
    log(f"train {spec['name']:<12} {spec['dtype']} {spec['config']:<15} {timed.median:9.3f} ms")
    return {"median_ms": timed.median, "repeats": timed.repeats}, step


# Per-op overhead at 1K elements.


def per_op_cases() -> dict[str, tuple[Callable[[], tuple], Callable[..., object]]]:
    vector = lambda: (torch.randn(1 << 10), torch.randn(1 << 10))  # noqa: E731
    return {
        "add": (vector, lambda a, b: a + b),
        "add_scalar": (vector, lambda a, b: a + 1.5),
        "mul": (vector, lambda a, b: a * b),
        "add_": (vector, lambda a, b: a.add_(b, alpha=1e-6)),
        "relu": (vector, lambda a, b: torch.relu(a)),
        "sum": (vector, lambda a, b: a.sum()),
        "mm_32x32": (lambda: (torch.randn(32, 32), torch.randn(32, 32)), torch.mm),
        "cat": (vector, lambda a, b: torch.cat([a, b])),
    }


def per_op(spec: dict, args, sync: Callable[[], None]) -> dict:
    make, run = per_op_cases()[spec["name"]]
    torch.manual_seed(0)
    inputs = tuple(t.to(spec["device"]) for t in make())
    fn = lambda: run(*inputs)  # noqa: E731
    latency = time_calls(fn, sync, args.budget / 2, warmup=20, max_repeats=100_000)
    throughput = time_calls(
        fn, sync, args.budget / 2, warmup=20, max_repeats=100_000, per_sample=PER_OP_CALLS
    )
    log(f"op    {spec['name']:<12} {spec['config']:<15} {latency.median * 1e3:8.2f} us  "
        f"{throughput.median * 1e3:8.2f} us/call in a loop")  # fmt: skip
    return {"latency_us": latency.median * 1e3, "throughput_us": throughput.median * 1e3,
            "repeats": latency.repeats + throughput.repeats * PER_OP_CALLS}  # fmt: skip


# The cross-home path: host data, an op on the GPU.


def cross_home_case(op: str, n: int) -> tuple[tuple, Callable[..., object]]:
    f = torch.nn.functional
    if op == "add":
        return (torch.randn(n), torch.randn(n)), torch.add
    if op in ("sort", "median", "cumsum"):
        return (torch.randn(n),), {
            "sort": torch.sort, "median": torch.median, "cumsum": lambda x: torch.cumsum(x, 0)
        }[op]  # fmt: skip
    if op == "nonzero":
        return ((torch.rand(n) > 0.5).float(),), torch.nonzero
    if op == "unique":
        return (torch.randint(0, max(2, n // 10), (n,)),), torch.unique
    if op == "repeat_interleave":
        return (torch.randn(n), torch.randint(0, 3, (n,))), torch.repeat_interleave
    if op == "embedding_bag":
        inputs = (torch.randn(10_000, 64), torch.randint(0, 10_000, (n,)),
                  torch.arange(max(1, n // 16)) * 16)  # fmt: skip
        return inputs, lambda w, i, o: f.embedding_bag(i, w, o, mode="sum")
    if op == "scatter_reduce_mean":
        m = max(1, n // 4)
        inputs = (torch.zeros(m), torch.randint(0, m, (n,)), torch.randn(n))
        return inputs, lambda x, i, s: x.scatter_reduce(0, i, s, reduce="mean")
    if op == "cdist":
        side = {1 << 10: 32, 1 << 20: 1024, 1 << 24: 4096}[n]
        return (torch.randn(side, 64), torch.randn(side, 64)), torch.cdist
    raise ValueError(op)


def to_cpu(result: object) -> object:
    if isinstance(result, torch.Tensor):
        return result.to("cpu")
    return tuple(to_cpu(r) for r in result)  # type: ignore[attr-defined]


def cross_home(spec: dict, args, sync: Callable[[], None]) -> dict:
    """The eager round trip from host tensors, or relay tensors homed on the host."""
    op, size = spec["name"].split()
    torch.manual_seed(0)
    inputs, run = cross_home_case(op, SIZES[size])
    if spec["device"] == "cuda":
        fn = lambda: to_cpu(run(*(t.to("cuda") for t in inputs)))  # noqa: E731
    else:
        moved = tuple(t.to(spec["device"]) for t in inputs)
        fn = lambda: run(*moved)  # noqa: E731
    timed = time_calls(fn, sync, args.budget, max_repeats=200)
    log(f"cross {spec['name']:<24} {spec['config']:<18} {timed.median:9.3f} ms")
    return {"median_ms": timed.median, "repeats": timed.repeats}


# Decoding: greedy generate() with a KV cache, the most launch-bound workload users run.

DECODE = dict(layers=4, hidden=256, heads=4, vocab=2048, prompt=8, new_tokens=64, eos=0)


def decoder(name: str) -> nn.Module:
    """A small Llama or GPT-2 with random weights (seed 0), as users try them."""
    import transformers

    d = DECODE
    if name == "llama":
        config = transformers.LlamaConfig(
            vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=4 * d["hidden"],
            num_hidden_layers=d["layers"], num_attention_heads=d["heads"],
            num_key_value_heads=d["heads"], max_position_embeddings=256,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.GPT2Config(
            vocab_size=d["vocab"], n_embd=d["hidden"], n_layer=d["layers"], n_head=d["heads"],
            n_positions=256, bos_token_id=0, eos_token_id=d["eos"],
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    return model.eval()


# Each side's decoder per row, built and warmed up once: training_bench measures
# decoding in slices of a round, one generate() call each.
_generators: dict[tuple[str, str], Callable[[], list[int]]] = {}


def generator(spec: dict, sync: Callable[[], None]) -> Callable[[], list[int]]:
    """The row's greedy generate(), warmed up; it returns the ids it made."""
    key = (spec["name"], spec["config"])
    if key in _generators:
        return _generators[key]
    torch.manual_seed(0)
    model = decoder(spec["name"]).to(spec["device"])
    seeded = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, DECODE["vocab"], (1, DECODE["prompt"]), generator=seeded)
    prompt = prompt.to(spec["device"])
    new = DECODE["new_tokens"]

    def generate() -> list[int]:
        # With an end-of-sequence token, as users decode: generate() checks each new
        # token against it (isin) and min_new_tokens masks it until the last token.
        with torch.no_grad():
            out = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                min_new_tokens=new, do_sample=False, use_cache=True, num_beams=1,
                pad_token_id=0, eos_token_id=DECODE["eos"],
            )  # fmt: skip
        return out[0].tolist()

    for _ in range(2):
        generate()
    sync()
    _generators[key] = generate
    return generate


def decode(spec: dict, args, sync: Callable[[], None]) -> dict:
    generate = generator(spec, sync)
    made: list[list[int]] = []  # each timed call's ids
    timed = time_calls(
        lambda: made.append(generate()), sync, slice_budget(args),
        warmup=0, min_repeats=1, max_repeats=50,
    )  # fmt: skip
    ms = timed.median
    tokens_per_s = DECODE["new_tokens"] / ms * 1e3
    log(f"decode {spec['name']:<11} {spec['config']:<15} {ms:9.3f} ms  {tokens_per_s:8.1f} tok/s")
    return {"median_ms": ms, "repeats": timed.repeats, "tokens_per_s": tokens_per_s,
            "ids": made[-1]}  # fmt: skip


# CUDA graph replay: a captured forward, replayed in a loop.

GRAPH = dict(layers=8, width=256, batch=4, replays=20)


def graph_replay(spec: dict, args, sync: Callable[[], None]) -> dict:
    torch.manual_seed(0)
    g = GRAPH
    model = nn.Sequential(*[nn.Linear(g["width"], g["width"]) for _ in range(g["layers"])])
    model = model.to(spec["device"]).eval()
    x = torch.randn(g["batch"], g["width"]).to(spec["device"])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        model(x)
    timed = time_calls(graph.replay, sync, slice_budget(args), warmup=10, max_repeats=10_000,
                       per_sample=g["replays"])  # fmt: skip
    log(f"graph  {spec['name']:<11} {spec['config']:<15} {timed.median * 1e3:9.2f} us per replay")
    return {"median_ms": timed.median, "repeats": timed.repeats * g["replays"]}


def plan(side: str, device: str) -> list[dict]:
    """The measurements of one side. "ref" names the native config a relay row compares with."""
    cuda = device == "cuda"
    if side == "native":
        train = [("cuda", "cuda", "cuda", "cuda")] if cuda else [("cpu", "cpu", "cpu", "cpu")]
        ops = [("cuda", "cuda", "cuda", "cuda")] if cuda else []
        ops.append(("cpu", "cpu", "cpu", "cpu"))
        cross = [("eager round trip", "cuda", "cuda", "eager round trip")] if cuda else []
    else:  # (config, tensor device, fallback target/home, ref)
        relay_cuda, relay_cpu = ("relay cuda/cuda", "relay", "cuda/cuda", "cuda"), (
            "relay cpu/cpu", "relay", "cpu/cpu", "cpu")  # fmt: skip
        train = [relay_cuda] if cuda else [relay_cpu]
        ops = [relay_cuda, relay_cpu] if cuda else [relay_cpu]
        cross = [("relay cuda/cpu", "relay", "cuda/cpu", "eager round trip")] if cuda else []
    specs = []
    for config, dev, placement, ref in train:
        specs += [{"kind": "train", "name": name, "dtype": dtype, "config": config,
                   "device": dev, "placement": placement, "ref": ref}
                  for name in MODELS for dtype in ("fp32", "bf16")]  # fmt: skip
    for config, dev, placement, ref in ops:
        specs += [{"kind": "op", "name": name, "config": config, "device": dev,
                   "placement": placement, "ref": ref} for name in per_op_cases()]  # fmt: skip
    for config, dev, placement, ref in train:
        specs += [{"kind": "decode", "name": name, "config": config, "device": dev,
                   "placement": placement, "ref": ref} for name in ("llama", "gpt2")]  # fmt: skip
        if cuda:
            specs.append({"kind": "graph", "name": "mlp", "config": config, "device": dev,
                          "placement": placement, "ref": ref})  # fmt: skip
    for config, dev, placement, ref in cross:
        specs += [{"kind": "cross_home", "name": f"{op} {size}", "config": config,
                   "device": dev, "placement": placement, "ref": ref}
                  for op, size in CROSS_HOME]  # fmt: skip
    return specs


_decode_calls: dict[tuple[str, str], dict[str, int]] = {}


def counted_calls(call: Callable[[], object], sync: Callable[[], None]) -> dict[str, int]:
    """The fallback calls of one more call of `call`, and the boxed ones among them."""
    calls = fallback_calls(call, sync)
    return {"fallback_calls": calls["calls"], "boxed_calls": sum(calls["boxed"].values())}


def measure(spec: dict, args) -> dict:
    """One measurement; relay specs first set the fallback target and the relay home."""
    uses_cuda = "cuda" in spec["placement"]
    fallback = None
    if spec["device"] == "relay":
        import torch_fallback
        import torch_fallback.relay

        target, home = spec["placement"].split("/")
        torch_fallback.set_target(target)
        torch_fallback.set_cuda_sync("stream")
        torch_fallback.relay.set_home(home)
        fallback = torch_fallback
    else:
        assert "torch_fallback" not in sys.modules, "the native side imported torch_fallback"
    sync = make_sync(uses_cuda)
    row = {k: spec[k] for k in ("kind", "name", "config", "ref") if k in spec}
    if spec["kind"] == "train":
        result, step = train_step(spec, args, sync)
        row["dtype"] = spec["dtype"]
        if fallback is not None:
            result |= counted_calls(step, sync)
    elif spec["kind"] == "op":
        result = per_op(spec, args, sync)
    elif spec["kind"] == "decode":
        result = decode(spec, args, sync)
        if fallback is not None:
            key = (spec["name"], spec["config"])
            if key not in _decode_calls:  # the same in every slice: counted once
                _decode_calls[key] = counted_calls(generator(spec, sync), sync)
            result |= _decode_calls[key]
    elif spec["kind"] == "graph":
        result = graph_replay(spec, args, sync)
    else:
        result = cross_home(spec, args, sync)
    return row | result
