"""Joining rollouts of different generate calls, whose prompt columns differ in width."""

from __future__ import annotations

import torch

from hybridflow.protocol import Batch

__all__ = ["PROMPT_COLUMNS", "concat_rollouts"]

PROMPT_COLUMNS = ("input_ids", "attention_mask", "position_ids")
"""Left-padded prompt columns: their width is the longest prompt of the batch they were collated in."""


def concat_rollouts(batches: list[Batch], pad_token_id: int) -> Batch:
    """The rows of ``batches`` in order, as one Batch, with the prompt columns left-padded to the widest.

    Prompts are collated to the longest prompt of their own batch, so rollouts of different generation
    rounds (dynamic sampling, continuations) differ in prompt width ``[rows, prompt_len]``; the response
    columns share ``max_new_tokens``. ``input_ids`` is padded with ``pad_token_id``, the masks and
    positions with 0. ``group_ids`` are kept as they are: renumber them if the batches' ids overlap.
    """
    width = max(batch[column].shape[1] for batch in batches for column in PROMPT_COLUMNS if column in batch)
    padded = []
    for batch in batches:
        columns = [c for c in PROMPT_COLUMNS if c in batch and batch[c].shape[1] < width]
        if columns:
            batch = batch.select(*[k for k in batch.keys() if k not in columns]) | Batch(
                {
                    c: torch.nn.functional.pad(
                        batch[c],
                        (width - batch[c].shape[1], 0),
                        value=pad_token_id if c == "input_ids" else 0,
                    )
                    for c in columns
                }
            )
        padded.append(batch)
    return Batch.concat(padded)
