"""The model zoo: Hugging Face architectures from small configs, random weights, no download.

Each entry builds a model on the CPU (float64, a fixed seed) and the inputs of its
three uses: an eval forward, AdamW training steps on a loss, and, for models that
generate text, greedy ``generate()`` with a KV cache. This module imports only
torch and transformers, so the eager reference process (zoo_runner) can share it
without importing torch_fallback.

Adding a model: one ``ZooModel`` in ``ZOO`` with its config class, its model class
and the kind of inputs it takes; ``CORE`` lists the ones the CUDA-wheel cells run (the
others are marked slow; the CPU cell, ``nox -s models`` and the GPU run them all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

DTYPE = torch.float64
BATCH, SEQ, VOCAB, IMAGE, AUDIO = 2, 8, 96, 32, 1600
NEW_TOKENS = 6

# Small sizes every text config takes under one name or another.
TEXT = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
    "max_position_embeddings": 64,
}


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str  # encoder, decoder, seq2seq, vision, audio, multimodal
    config: str  # transformers config class
    model: str  # transformers model class
    settings: dict[str, Any] = field(default_factory=dict)
    inputs: str = "text"  # which make_inputs branch
    generates: bool = False
    note: str = ""


def _text(**extra: Any) -> dict[str, Any]:
    return {**TEXT, **extra}


ZOO: list[ZooModel] = [
    # encoders (masked language models: the head is tied to the embedding)
    ZooModel("bert", "encoder", "BertConfig", "BertForMaskedLM", _text()),
    ZooModel("roberta", "encoder", "RobertaConfig", "RobertaForMaskedLM", _text(pad_token_id=1)),
    ZooModel(
        "albert",
        "encoder",
        "AlbertConfig",
        "AlbertForMaskedLM",
        _text(embedding_size=16),
        note="one layer shared by every depth",
    ),
    ZooModel(
        "deberta-v2",
        "encoder",
        "DebertaV2Config",
        "DebertaV2ForMaskedLM",
        _text(relative_attention=True, position_buckets=8, pos_att_type=["p2c", "c2p"]),
    ),
    ZooModel(
        "distilbert",
        "encoder",
        "DistilBertConfig",
        "DistilBertForMaskedLM",
        {
            "vocab_size": VOCAB,
            "dim": 32,
            "n_layers": 2,
            "n_heads": 4,
            "hidden_dim": 37,
            "max_position_embeddings": 64,
        },
    ),
    # decoders
    ZooModel(
        "gpt2",
        "decoder",
        "GPT2Config",
        "GPT2LMHeadModel",
        {
            "vocab_size": VOCAB,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            "bos_token_id": 1,
            "eos_token_id": 2,
        },
        generates=True,
    ),
    ZooModel(
        "gpt-neo",
        "decoder",
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 4,
            "attention_types": [[["global", "local"], 1]],
            "window_size": 4,
            "max_position_embeddings": 64,
        },
        generates=True,
        note="local attention windows",
    ),
    ZooModel(
        "opt",
        "decoder",
        "OPTConfig",
        "OPTForCausalLM",
        {
            "vocab_size": VOCAB,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 37,
            "word_embed_proj_dim": 32,
            "max_position_embeddings": 64,
        },
        generates=True,
    ),
    ZooModel(
        "llama",
        "decoder",
        "LlamaConfig",
        "LlamaForCausalLM",
        _text(num_key_value_heads=2),
        generates=True,
        note="grouped-query attention, RoPE",
    ),
    ZooModel(
        "mistral",
        "decoder",
        "MistralConfig",
        "MistralForCausalLM",
        _text(num_key_value_heads=2, sliding_window=4),
        generates=True,
        note="sliding window",
    ),
    ZooModel(
        "qwen2",
        "decoder",
        "Qwen2Config",
        "Qwen2ForCausalLM",
        _text(num_key_value_heads=2),
        generates=True,
    ),
    ZooModel(
        "gemma",
        "decoder",
        "GemmaConfig",
        "GemmaForCausalLM",
        _text(num_key_value_heads=1, head_dim=8),
        generates=True,
        note="tied head",
    ),
    ZooModel(
        "phi",
        "decoder",
        "PhiConfig",
        "PhiForCausalLM",
        _text(),
        generates=True,
        note="partial rotary",
    ),
    ZooModel(
        "mixtral",
        "decoder",
        "MixtralConfig",
        "MixtralForCausalLM",
        _text(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        generates=True,
        note="mixture of experts",
    ),
    ZooModel(
        "bloom",
        "decoder",
        "BloomConfig",
        "BloomForCausalLM",
        {"vocab_size": VOCAB, "hidden_size": 32, "n_layer": 2, "n_head": 4},
        generates=True,
        note="ALiBi",
    ),
    ZooModel(
        "falcon",
        "decoder",
        "FalconConfig",
        "FalconForCausalLM",
        _text(alibi=True, new_decoder_architecture=False, multi_query=True),
        generates=True,
        note="ALiBi, multi-query",
    ),
    # sequence to sequence
    ZooModel(
        "t5",
        "seq2seq",
        "T5Config",
        "T5ForConditionalGeneration",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "d_kv": 8,
            "d_ff": 37,
            "num_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "decoder_start_token_id": 0,
        },
        inputs="seq2seq",
        generates=True,
        note="relative position buckets, tied head",
    ),
    ZooModel(
        "bart",
        "seq2seq",
        "BartConfig",
        "BartForConditionalGeneration",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 37,
            "decoder_ffn_dim": 37,
            "max_position_embeddings": 64,
        },
        inputs="seq2seq",
        generates=True,
    ),
    ZooModel(
        "whisper",
        "seq2seq",
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        {
            "vocab_size": VOCAB,
            "d_model": 32,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 37,
            "decoder_ffn_dim": 37,
            "num_mel_bins": 16,
            "max_source_positions": 16,
            "max_target_positions": 32,
            "decoder_start_token_id": 1,
            "pad_token_id": 0,
            "eos_token_id": 2,
            "bos_token_id": 1,
            "suppress_tokens": [],
            "begin_suppress_tokens": [],
        },
        inputs="speech",
        generates=True,
        note="convolutional audio encoder",
    ),
    # vision
    ZooModel(
        "vit",
        "vision",
        "ViTConfig",
        "ViTForImageClassification",
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 37,
            "image_size": IMAGE,
            "patch_size": 8,
            "num_labels": 3,
        },
        inputs="image",
    ),
    ZooModel(
        "swin",
        "vision",
        "SwinConfig",
        "SwinForImageClassification",
        {
            "image_size": IMAGE,
            "patch_size": 4,
            "embed_dim": 16,
            "depths": [1, 1],
            "num_heads": [2, 4],
            "window_size": 4,
            "num_labels": 3,
        },
        inputs="image",
        note="shifted windows",
    ),
    ZooModel(
        "convnext",
        "vision",
        "ConvNextConfig",
        "ConvNextForImageClassification",
        {"num_stages": 2, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 3},
        inputs="image",
    ),
    ZooModel(
        "resnet",
        "vision",
        "ResNetConfig",
        "ResNetForImageClassification",
        {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1], "num_labels": 3},
        inputs="image",
        note="batch norm",
    ),
    ZooModel(
        "mobilenet-v2",
        "vision",
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        {"image_size": IMAGE, "depth_multiplier": 0.25, "num_labels": 3},
        inputs="image",
        note="depthwise convolutions, ReLU6",
    ),
    # audio
    ZooModel(
        "wav2vec2",
        "audio",
        "Wav2Vec2Config",
        "Wav2Vec2ForCTC",
        {
            "vocab_size": 12,
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 37,
            "conv_dim": [16, 16],
            "conv_stride": [5, 4],
            "conv_kernel": [10, 8],
            "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 4,
            "mask_time_prob": 0.0,
            "ctc_loss_reduction": "mean",
        },
        inputs="audio",
        note="CTC loss, grouped positional convolution",
    ),
    # multimodal
    ZooModel(
        "clip",
        "multimodal",
        "CLIPConfig",
        "CLIPModel",
        {
            "text_config": {
                "vocab_size": VOCAB,
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 37,
                "max_position_embeddings": 16,
                "bos_token_id": 1,
                "eos_token_id": 2,
            },
            "vision_config": {
                "hidden_size": 32,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 37,
                "image_size": IMAGE,
                "patch_size": 8,
            },
            "projection_dim": 16,
        },
        inputs="image-text",
        note="contrastive loss",
    ),
]
BY_NAME = {model.name: model for model in ZOO}

# The CPU cells' time-boxed subset: one of each family, the tied and shared weights.
CORE = ("bert", "albert", "gpt2", "llama", "mixtral", "t5", "resnet", "wav2vec2", "clip")


def _no_dropout(config: transformers.PretrainedConfig) -> None:
    """Every dropout probability to 0: the comparison is of arithmetic, not of RNG streams."""
    for part in (config, *(getattr(config, k, None) for k in ("text_config", "vision_config"))):
        if part is None:
            continue
        for key, value in list(vars(part).items()):
            if ("dropout" in key or key.endswith("_pdrop") or key == "layerdrop") and isinstance(
                value, float
            ):
                setattr(part, key, 0.0)


def build(entry: ZooModel) -> torch.nn.Module:
    """The model of ``entry``, float64, weights from the current RNG state."""
    config = getattr(transformers, entry.config)(**entry.settings)
    _no_dropout(config)
    if entry.settings.get("num_local_experts"):
        # torch._grouped_mm, transformers' default for experts, has no float64 kernel
        config._experts_implementation = "eager"
    model_class: Callable[..., torch.nn.Module] = getattr(transformers, entry.model)
    return model_class(config).to(DTYPE)


def make_case(name: str, steps: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model (CPU, fixed seed) and its inputs: ``steps`` training batches, eval inputs and,
    for models that generate, a prompt."""
    entry = BY_NAME[name]
    torch.manual_seed(0)
    model = build(entry)
    gen = torch.Generator().manual_seed(1)
    batches = [make_inputs(entry, gen, labels=True) for _ in range(steps)]
    case: dict[str, Any] = {"batches": batches, "eval": make_inputs(entry, gen, labels=False)}
    if entry.generates:
        prompt = make_inputs(entry, gen, labels=False)
        if entry.inputs == "text":
            prompt["attention_mask"] = torch.ones_like(prompt["input_ids"])
        case["prompt"] = prompt
    return model, case


def make_inputs(entry: ZooModel, gen: torch.Generator, labels: bool) -> dict[str, Any]:
    def ids(*shape: int, high: int = VOCAB) -> torch.Tensor:
        return torch.randint(3, high, shape, generator=gen)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=DTYPE)

    kind = entry.inputs
    if kind == "text":
        inputs = {"input_ids": ids(BATCH, SEQ)}
        if entry.family == "encoder":
            mask = torch.ones(BATCH, SEQ, dtype=torch.long)
            mask[1, -2:] = 0  # padding
            inputs["attention_mask"] = mask
        if labels:
            inputs["labels"] = ids(BATCH, SEQ)
        return inputs
    if kind == "seq2seq":
        inputs = {"input_ids": ids(BATCH, SEQ)}
        if labels:
            inputs["labels"] = ids(BATCH, SEQ // 2)
        else:
            inputs["decoder_input_ids"] = ids(BATCH, SEQ // 2)
        return inputs
    if kind == "speech":
        inputs = {"input_features": randn(BATCH, 16, 32)}
        if labels:
            inputs["labels"] = ids(BATCH, 5)
        else:
            inputs["decoder_input_ids"] = ids(BATCH, 4)
        return inputs
    if kind == "image":
        inputs = {"pixel_values": randn(BATCH, 3, IMAGE, IMAGE)}
        if labels:
            inputs["labels"] = torch.randint(0, 3, (BATCH,), generator=gen)
        return inputs
    if kind == "audio":
        inputs = {"input_values": randn(BATCH, AUDIO)}
        if labels:
            inputs["labels"] = ids(BATCH, 4, high=12)
        return inputs
    if kind == "image-text":
        inputs = {"input_ids": ids(BATCH, SEQ), "pixel_values": randn(BATCH, 3, IMAGE, IMAGE)}
        if labels:
            inputs["return_loss"] = True
        return inputs
    raise ValueError(f"{entry.name}: unknown inputs {kind!r}")
