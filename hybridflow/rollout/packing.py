"""Converting between prompt Batches and per-sample token lists, shared by the engines."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hybridflow.protocol import Batch

__all__ = ["FINISH_LENGTH", "FINISH_STOP", "pack_rollouts", "prompt_token_lists"]

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


def prompt_token_lists(prompts: Batch) -> list[list[int]]:
    """The real (unpadded) token ids of each prompt row.

    Args:
        prompts: ``input_ids [batch, prompt_len]`` left-padded, ``attention_mask [batch, prompt_len]``
            with 1 on real tokens.

    Raises:
        ValueError: on missing columns, shape mismatch, right padding or an empty prompt.
    """
    for key in ("input_ids", "attention_mask"):
        if key not in prompts:
            raise ValueError(f"prompts need an {key!r} column; columns are {prompts.keys()}")
    input_ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
    if input_ids.shape != mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(mask.shape)} must be equal 2-d shapes"
        )
    lengths = mask.sum(dim=1)
    if (lengths == 0).any():
        raise ValueError(f"prompt rows {torch.nonzero(lengths == 0).flatten().tolist()} have no tokens")
    # Left padding means the real tokens are a suffix: the mask never drops from 1 back to 0.
    if (mask[:, 1:].long() - mask[:, :-1].long() < 0).any():
        raise ValueError("prompts must be left-padded (attention_mask 0...0 1...1 in every row)")
    width = input_ids.shape[1]
    return [row[width - int(n) :].tolist() for row, n in zip(input_ids, lengths, strict=True)]


def pack_rollouts(
    prompts: Batch,
    n: int,
    responses: Sequence[Sequence[int]],
    log_probs: Sequence[Sequence[float]],
    finish_reasons: Sequence[str],
    max_new_tokens: int,
    pad_token_id: int,
) -> Batch:
    """The output Batch of ``generate``: prompt columns repeated ``n`` times plus the response columns.

    Args:
        prompts: the input Batch (``len(prompts)`` rows).
        n: samples per prompt; ``responses`` etc. are ordered prompt-major (row ``i*n + j``).
        responses: ``len(prompts) * n`` token lists, each at most ``max_new_tokens`` long.
        log_probs: matching per-token log-probs in nats.
        finish_reasons: ``"stop"`` or ``"length"`` per sample.
        max_new_tokens: width of the response columns, fixed so Batches from different ranks concat.
        pad_token_id: fills ``responses`` past each sample's end.

    Returns:
        ``prompts.repeat(n)`` with ``responses [rows, max_new_tokens]`` (int64),
        ``response_mask [rows, max_new_tokens]`` (int64, 1 on generated tokens),
        ``rollout_log_probs [rows, max_new_tokens]`` (float32, 0 on padding), ``response_lengths [rows]``
        and the non-tensor column ``finish_reason``.
    """
    rows = len(prompts) * n
    if not len(responses) == len(log_probs) == len(finish_reasons) == rows:
        raise ValueError(
            f"expected {rows} samples, got {len(responses)} responses, {len(log_probs)} log-prob lists "
            f"and {len(finish_reasons)} finish reasons"
        )
    tokens = torch.full((rows, max_new_tokens), pad_token_id, dtype=torch.long)
    values = torch.zeros((rows, max_new_tokens), dtype=torch.float32)
    lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
    if (lengths > max_new_tokens).any():
        raise ValueError(f"a response is longer than max_new_tokens={max_new_tokens}")
    for row, (response, row_log_probs) in enumerate(zip(responses, log_probs, strict=True)):
        if len(row_log_probs) != len(response):
            raise ValueError(f"sample {row} has {len(response)} tokens but {len(row_log_probs)} log-probs")
        tokens[row, : len(response)] = torch.as_tensor(response, dtype=torch.long)
        values[row, : len(response)] = torch.as_tensor(row_log_probs, dtype=torch.float32)
    mask = (torch.arange(max_new_tokens).unsqueeze(0) < lengths.unsqueeze(1)).long()
    samples = Batch(
        {
            "responses": tokens,
            "response_mask": mask,
            "rollout_log_probs": values,
            "response_lengths": lengths,
        },
        {"finish_reason": np.array(list(finish_reasons), dtype=object)},
    )
    return prompts.repeat(n) | samples
