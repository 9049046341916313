"""Tiny models, skewed batches and a gloo process launcher shared by the parallel tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.parallel import VARLEN_SDPA
from hybridflow.parallel.launch import run_ranks

VOCAB = 101


def tiny_qwen2(seed: int = 0, *, tied: bool = False, attn: str = VARLEN_SDPA) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 of ~20k parameters; the same seed gives the same weights in every process.

    The default attention is the CPU training path for packed rows.
    """
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        attn_implementation=attn,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def skewed_batch(
    lengths: Sequence[int], seq_len: int, *, left: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids, attention_mask [len(lengths), seq_len]`` with the valid tokens padded left or right."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (len(lengths), seq_len), generator=generator)
    mask = torch.zeros(len(lengths), seq_len, dtype=torch.long)
    for row, length in enumerate(lengths):
        if left:
            mask[row, seq_len - length :] = 1
        else:
            mask[row, :length] = 1
    # Pads carry a token id that is never valid, so a wrong mask shows up in the numbers.
    return input_ids.masked_fill(mask == 0, VOCAB - 1), mask


def _one_thread(rank: int, world_size: int, fn: Callable[..., None], args: tuple) -> None:
    # Two processes on two cores: one thread each, or they fight over the cores.
    torch.set_num_threads(1)
    fn(rank, world_size, *args)


def run_distributed(fn: Callable[..., None], world_size: int, *args: object) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` gloo processes of one thread each
    (`hybridflow.parallel.launch.run_ranks`, which starts again on another port if its first is taken);
    a failure in any raises here."""
    run_ranks(_one_thread, world_size, fn, args, timeout_s=900)
