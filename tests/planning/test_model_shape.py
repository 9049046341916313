"""Parameter shapes and counts from config.json against the models transformers builds from it."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen2ForSequenceClassification,
    Qwen3Config,
)

from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.planning import ModelShape, count_parameters, parameter_shapes
from workers.critic import load_value_model

SIZES = dict(vocab_size=37, hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=80)

CAUSAL_CONFIGS = {
    "qwen2 untied": Qwen2Config(**SIZES, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen2 tied": Qwen2Config(**SIZES, num_key_value_heads=3, tie_word_embeddings=True),
    "llama with biases": LlamaConfig(**SIZES, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    "llama plain, tied": LlamaConfig(**SIZES, num_key_value_heads=6, tie_word_embeddings=True),
    "qwen3 wide heads": Qwen3Config(**SIZES, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "mistral": MistralConfig(**SIZES, num_key_value_heads=2),
}


def _named_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


@pytest.mark.parametrize("name", list(CAUSAL_CONFIGS))
def test_every_parameter_of_a_built_causal_lm(name: str) -> None:
    config = CAUSAL_CONFIGS[name]
    model = AutoModelForCausalLM.from_config(config)
    shape = ModelShape.from_hf_config(config.to_dict())
    assert parameter_shapes(shape, "lm") == _named_shapes(model)
    assert count_parameters(shape, "lm") == sum(p.numel() for p in model.parameters())


def test_tiny_builder_and_a_saved_config_json(tmp_path) -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(len(tokenizer), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1)
    path = save_model_dir(model, tokenizer, tmp_path / "tiny")
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(path).to_dict())
    # By hand, per layer: q (64x64 + 64), k and v (32x64 + 32 each), o (64x64), the MLP (3 x 128x64)
    # and two norms (64 each); then the final norm, the embedding and the untied head (100x64 each).
    per_layer = 4160 + 2 * 2080 + 4096 + 3 * 8192 + 128
    expected = 2 * per_layer + 64 + 2 * 6400
    assert count_parameters(shape) == sum(p.numel() for p in model.parameters()) == expected


def test_critic_value_model_and_reward_classifier(tmp_path) -> None:
    tokenizer = build_char_tokenizer()
    path = save_model_dir(
        build_tiny_causal_lm(len(tokenizer), num_kv_heads=1), tokenizer, tmp_path / "policy"
    )
    value_model = load_value_model(str(path))
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(path).to_dict())
    assert parameter_shapes(shape, "value") == _named_shapes(value_model)

    classifier = Qwen2ForSequenceClassification(Qwen2Config(**SIZES, num_key_value_heads=2, num_labels=1))
    rm_shape = ModelShape.from_hf_config(classifier.config.to_dict())
    assert parameter_shapes(rm_shape, "score") == _named_shapes(classifier)
    assert count_parameters(rm_shape, "score") == sum(p.numel() for p in classifier.parameters())


def test_unknown_architecture_and_missing_key_are_named() -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2' is not one the planner knows"):
        ModelShape.from_hf_config({"model_type": "gpt2"}, source="m/config.json")
    config = Qwen2Config(**SIZES).to_dict()
    del config["intermediate_size"]
    with pytest.raises(ValueError, match=re.escape("m/config.json: qwen2 config has no 'intermediate_size'")):
        ModelShape.from_hf_config(config, source="m/config.json")
