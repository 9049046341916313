"""Re²'s two-stage rollout as row surgery on Batches: where each full sample is cut, the continuation
prompts (prompt + prefix), the per-row length budget of a continuation, and the cut after the redo phrase.

All of it runs on the controller between two ``generate`` calls; the engine only ever sees prompts. A
prefix moved into the prompt is part of ``input_ids`` (``attention_mask`` 1) and never of ``responses``,
so it carries no loss: only the continuation's tokens do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from hybridflow.protocol import Batch
from recipes.re2.re2_redo import REDO_PHRASE, phrase_end_token

__all__ = ["cap_lengths", "continuation_prompts", "cut_after_redo", "cut_lengths", "prefix_token_lists"]

RESPONSE_COLUMNS = ("responses", "response_mask", "rollout_log_probs", "response_lengths")


def cut_lengths(
    lengths: Tensor, generator: torch.Generator, zero_prob: float = 0.3, max_ratio: float = 0.8
) -> Tensor:
    """How many leading tokens of each sample become its prefix.

    Args:
        lengths: ``[batch]`` int, the samples' response lengths in tokens (end-of-sequence included).
        generator: the random stream (seeded per step by the caller).
        zero_prob: probability of the ratio 0 (an empty prefix: a fresh sample of the question).
        max_ratio: otherwise the ratio is uniform in ``[0, max_ratio]``.

    Returns:
        ``[batch]`` int64 ``floor(ratio * length)``.
    """
    rows = lengths.shape[0]
    zero = torch.rand(rows, generator=generator, dtype=torch.float64) < zero_prob
    ratio = torch.rand(rows, generator=generator, dtype=torch.float64) * max_ratio
    ratio = torch.where(zero, torch.zeros_like(ratio), ratio)
    return torch.floor(ratio * lengths.double()).long()


def prefix_token_lists(responses: Tensor, prefix_lengths: Tensor) -> list[list[int]]:
    """The first ``prefix_lengths[i]`` tokens of each row of ``responses [batch, response_len]``."""
    return [row[: int(k)].tolist() for row, k in zip(responses, prefix_lengths, strict=True)]


def continuation_prompts(
    prompts: Batch, prefixes: Sequence[Sequence[int]], pad_token_id: int, prefix_width: int
) -> Batch:
    """Prompt rows with each row's prefix appended, left-padded to the longest.

    Args:
        prompts: one row per prefix: left-padded ``input_ids`` and ``attention_mask`` and the prompt's
            other columns (``ground_truth``, ``data_source``, ...), which are carried along.
        prefixes: the prefix tokens of each row (possibly empty).
        pad_token_id: written into the padding.
        prefix_width: width of the ``prefix_tokens`` column, at least the longest prefix (fixed, so that
            the continuations of several rounds concatenate).

    Returns:
        The rows with ``input_ids``, ``attention_mask`` and ``position_ids`` (0 at the first real
        token) replaced, and ``prefix_tokens [batch, prefix_width]`` (right-padded) and
        ``prefix_lengths [batch]`` added, which the continuations keep to rebuild the full sample.
    """
    if len(prefixes) != len(prompts):
        raise ValueError(f"{len(prefixes)} prefixes for {len(prompts)} prompt rows")
    mask = prompts["attention_mask"].bool()
    sequences = [
        ids[row_mask].tolist() + list(prefix)
        for ids, row_mask, prefix in zip(prompts["input_ids"], mask, prefixes, strict=True)
    ]
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        input_ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        attention_mask[row, width - len(sequence) :] = 1
    lengths = torch.tensor([len(p) for p in prefixes], dtype=torch.long)
    if int(lengths.max()) > prefix_width:
        raise ValueError(f"a prefix of {int(lengths.max())} tokens is wider than prefix_width={prefix_width}")
    prefix_tokens = torch.full((len(prefixes), prefix_width), pad_token_id, dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        prefix_tokens[row, : len(prefix)] = torch.tensor(list(prefix), dtype=torch.long)
    replaced = ("input_ids", "attention_mask", "position_ids")
    kept = prompts.select(*[key for key in prompts.keys() if key not in replaced])
    return kept | Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
            "prefix_tokens": prefix_tokens,
            "prefix_lengths": lengths,
        }
    )


def cap_lengths(rollouts: Batch, budgets: Tensor, pad_token_id: int) -> Batch:
    """The response columns with each row cut to at most ``budgets[i]`` tokens, as if generated with that
    limit: a row cut here ends with ``finish_reason`` ``"length"``.

    A continuation's budget is the full sample's limit less its prefix, so prefix + continuation is never
    longer than a first-stage sample. Returns the replacement columns (``RESPONSE_COLUMNS`` and
    ``finish_reason``); the caller pops the old ones.
    """
    lengths = rollouts["response_lengths"]
    kept = torch.minimum(lengths, budgets.clamp(min=0))
    positions = torch.arange(rollouts["responses"].shape[1])
    mask = (positions[None, :] < kept[:, None]).long()
    finish = np.asarray(rollouts["finish_reason"], dtype=object).copy()
    finish[(kept < lengths).numpy()] = "length"
    return Batch(
        {
            "responses": torch.where(
                mask.bool(), rollouts["responses"], torch.full_like(rollouts["responses"], pad_token_id)
            ),
            "response_mask": mask,
            "rollout_log_probs": rollouts["rollout_log_probs"] * mask,
            "response_lengths": kept,
        },
        {"finish_reason": finish},
    )


def cut_after_redo(
    rollouts: Batch,
    decode: Callable[[list[int]], str],
    eos_token_id: int,
    pad_token_id: int,
    phrase: str = REDO_PHRASE,
) -> Batch:
    """Cut every response whose full text (its prefix, then the response) contains ``phrase`` right after
    the phrase, and append ``eos_token_id`` there when the row has room (a sampled one right after the
    phrase is kept as it is). A row's room is the response width less its prefix: a whole sample
    (prefix, then response) never holds more tokens than a first-stage sample may, so a continuation
    whose phrase ends on its last allowed token gets no EOS, as a first-stage sample that fills its
    width does not.

    Reads ``responses``, ``response_lengths``, ``rollout_log_probs``, ``finish_reason`` and, for
    continuations, ``prefix_tokens`` and ``prefix_lengths`` (absent: empty prefixes). Returns the
    replacement ``RESPONSE_COLUMNS`` and ``finish_reason`` (``"stop"`` for a cut row), plus
    ``appended_eos [batch, response_len]`` bool marking the appended token: the engine never sampled it,
    so it has no rollout log-prob (0 there until the caller fills one in).
    """
    responses = rollouts["responses"].clone()
    log_probs = rollouts["rollout_log_probs"].clone()
    lengths = rollouts["response_lengths"].clone()
    width = responses.shape[1]
    appended = torch.zeros_like(responses, dtype=torch.bool)
    finish = np.asarray(rollouts["finish_reason"], dtype=object).copy()
    has_prefix = "prefix_tokens" in rollouts
    for row in range(len(rollouts)):
        prefix = (
            rollouts["prefix_tokens"][row, : int(rollouts["prefix_lengths"][row])].tolist()
            if has_prefix
            else []
        )
        response = responses[row, : int(lengths[row])].tolist()
        end = phrase_end_token(prefix + response, decode, phrase)
        if end is None:
            continue
        keep = max(end - len(prefix), 0)
        room = width - len(prefix)
        sampled_eos = keep < len(response) and response[keep] == eos_token_id
        responses[row, keep + sampled_eos :] = pad_token_id
        log_probs[row, keep + sampled_eos :] = 0.0
        if keep < room and not sampled_eos:
            responses[row, keep] = eos_token_id
            appended[row, keep] = True
        lengths[row] = min(keep + 1, room)
        finish[row] = "stop"
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return Batch(
        {
            "responses": responses,
            "response_mask": mask,
            "rollout_log_probs": log_probs,
            "response_lengths": lengths,
            "appended_eos": appended,
        },
        {"finish_reason": finish},
    )
