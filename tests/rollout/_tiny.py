"""The tiny model, tokenizer and prompts the rollout tests share."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.rollout.config import RolloutConfig

ALPHABET = "0123456789+-*=()abcdefghij"
PROMPT_TEXTS = ("12+7=", "3*(4-1)=", "a", "ab+cd*9=")
# Where vLLM and TorchInductor keep compile caches across test runs (git-ignored).
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache"


def vllm_config() -> RolloutConfig:
    """A vLLM engine for the tiny model: a 64 MiB KV cache, up to 32 sequences, eager, caches in
    `CACHE_DIR`."""
    return RolloutConfig(
        engine="vllm", kv_cache_bytes=64 << 20, max_num_seqs=32, enforce_eager=True, cache_dir=str(CACHE_DIR)
    )


def tokenizer() -> PreTrainedTokenizerFast:
    return build_char_tokenizer(ALPHABET)


def model(seed: int = 0) -> PreTrainedModel:
    """A 2-layer fp32 Qwen2 with peaked next-token distributions (wide greedy margins)."""
    return build_tiny_causal_lm(len(tokenizer()), seed=seed, initializer_range=0.2)


def write_model_dir(path: Path) -> Path:
    return save_model_dir(model(), tokenizer(), path)


def prompts(texts: tuple[str, ...] = PROMPT_TEXTS) -> Batch:
    """Left-padded prompts of different lengths, with a ``uid`` non-tensor column."""
    encoded = tokenizer()(list(texts), padding=True, return_tensors="pt")
    return Batch(
        {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]},
        {"uid": [f"p{i}" for i in range(len(texts))]},
    )


def perturbed_state(model: PreTrainedModel, scale: float = 0.05, seed: int = 123) -> dict[str, torch.Tensor]:
    """The model's state with Gaussian noise added; the same in every process."""
    generator = torch.Generator().manual_seed(seed)
    return {
        name: tensor + scale * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        for name, tensor in model.state_dict().items()
    }
