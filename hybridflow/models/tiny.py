"""Small randomly initialised causal LMs for tests, demos and benchmarks.

The architecture is Qwen2 because vLLM (including the CPU build) and transformers both implement it, so
the same weights run in the training layout and in the inference engine.
"""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

__all__ = ["build_tiny_causal_lm"]


def build_tiny_causal_lm(
    vocab_size: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 256,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    *,
    initializer_range: float = 0.02,
    pad_token_id: int = 0,
    bos_token_id: int = 1,
    eos_token_id: int = 2,
) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM with random weights drawn from ``torch.manual_seed(seed)``.

    The defaults give a head size of 32, the smallest vLLM's CPU attention accepts (it supports 32, 64,
    80, 96, 112, 128, ...); with tensor parallelism, ``num_kv_heads`` should divide by the TP size.
    The same arguments always give the same weights. ``initializer_range`` is the std of the weight
    init; a larger value (e.g. 0.2) gives peaked next-token distributions, so greedy decoding has wide
    margins between the first and second choice and differs from sampling. The special-token ids are
    written into the config so that vLLM and ``generate`` stop on the same end-of-sequence token.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must divide by num_heads ({num_heads}), "
            f"and num_heads by num_kv_heads ({num_kv_heads})"
        )
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
    )
    # Seed a private RNG scope so building a model does not disturb the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.bos_token_id = bos_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model.to(dtype).eval()
