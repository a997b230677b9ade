"""A checkpoint loaded with Hugging Face's from_pretrained, onto relay or moved there.

The everyday way in to a pretrained model: `from_pretrained(..., device_map="relay")`,
or a CPU load followed by `.to("relay")` and fine-tuning. Both with `use_kernels=False`:
the hub-kernels layer of transformers refuses device types it does not list
(docs/relay.md). Compared with the same checkpoint on the CPU, in float64.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import transformers

import torch_fallback.relay  # noqa: F401  (registers the relay device)

pytestmark = [
    pytest.mark.usefixtures("placement"),
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
]

f64 = torch.float64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small Llama with tied embeddings, saved as a Hugging Face checkpoint."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("pretrained")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    return path


def load(path: Path, **kwargs) -> torch.nn.Module:
    return transformers.LlamaForCausalLM.from_pretrained(
        path, dtype=f64, use_kernels=False, **kwargs
    )


def is_tied(model: torch.nn.Module) -> bool:
    return model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@pytest.mark.parametrize("device_map", ["relay", {"": "relay"}], ids=["name", "dict"])
def test_from_pretrained_loads_onto_relay_as_onto_the_cpu(checkpoint, device_map):
    on_cpu = load(checkpoint)
    on_relay = load(checkpoint, device_map=device_map)
    tensors = [*on_relay.parameters(), *on_relay.buffers()]
    assert {tensor.device.type for tensor in tensors} == {"relay"}
    assert is_tied(on_relay)
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    with torch.no_grad():
        expected = on_cpu(ids).logits
        got = on_relay(ids.to("relay")).logits
    torch.testing.assert_close(got.cpu(), expected)
    generated = on_relay.generate(ids.to("relay"), max_new_tokens=6, do_sample=False)
    assert torch.equal(generated.cpu(), on_cpu.generate(ids, max_new_tokens=6, do_sample=False))


def test_a_pretrained_model_moved_to_relay_fine_tunes_as_on_the_cpu(checkpoint):
    eager = load(checkpoint)
    moved = copy.deepcopy(eager).to("relay")
    assert is_tied(moved)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    losses = {}
    for model, inputs in ((eager, ids), (moved, ids.to("relay"))):
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[inputs.device.type] = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(inputs, labels=inputs).loss
            loss.backward()
            optimizer.step()
            losses[inputs.device.type].append(loss.item())
    assert losses["relay"] == pytest.approx(losses["cpu"], rel=1e-9)
    assert is_tied(moved)
    for (name, expected), (_, got) in zip(
        eager.state_dict().items(), moved.state_dict().items(), strict=True
    ):
        torch.testing.assert_close(got.cpu(), expected, msg=name)
