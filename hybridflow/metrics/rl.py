"""Metrics of one RL step, computed from the step's Batch by pure functions.

Columns read (each function skips what is missing, so :func:`step_metrics` works at any stage):

=======================  ==========================  ===============================================
column                   shape                       meaning
=======================  ==========================  ===============================================
``response_mask``        ``[batch, response_len]``   1 on generated tokens
``scores``               ``[batch]``                 the reward function's score per sample
``token_level_rewards``  ``[batch, response_len]``   rewards per token (after shaping / KL penalty)
``group_ids``            ``[batch]``/``[batch, L]``  samples with equal ids answer the same prompt
``advantages``           ``[batch, response_len]``   estimator output
``returns``              ``[batch, response_len]``   estimator output
``values``               ``[batch, response_len]``   critic values
``rollout_log_probs``    ``[batch, response_len]``   log-probs the engine reported when sampling
``old_log_probs``        ``[batch, response_len]``   the same tokens recomputed by the training layout
``finish_reason``        non-tensor ``[batch]``      ``"stop"`` or ``"length"`` (hit the token limit)
=======================  ==========================  ===============================================
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from hybridflow.algos import group_index
from hybridflow.contract import sampled_response_mask
from hybridflow.metrics.reduce import tensor_stats
from hybridflow.protocol import Batch

__all__ = [
    "advantage_metrics",
    "group_metrics",
    "log_prob_gap_metrics",
    "response_length_metrics",
    "reward_metrics",
    "sequence_scores",
    "step_metrics",
    "truncation_metrics",
    "zero_variance_group_fraction",
]


def _response_mask(batch: Batch) -> Tensor | None:
    return batch["response_mask"].bool() if "response_mask" in batch else None


def sequence_scores(batch: Batch) -> Tensor | None:
    """One score per sample: ``scores``, else the masked sum of ``token_level_rewards`` (as the estimators do)."""
    if "scores" in batch:
        return batch["scores"].double()
    mask = _response_mask(batch)
    if "token_level_rewards" in batch and mask is not None:
        return (batch["token_level_rewards"].double() * mask).sum(-1)
    return None


def reward_metrics(batch: Batch) -> dict[str, float]:
    """``score/*`` from ``scores`` and ``reward/*`` from per-sample sums of ``token_level_rewards``.

    The two differ when shaping or an in-reward KL penalty changes the rewards after scoring.
    """
    out: dict[str, float] = {}
    if "scores" in batch:
        out.update(tensor_stats("score", batch["scores"]))
    mask = _response_mask(batch)
    if "token_level_rewards" in batch and mask is not None:
        out.update(tensor_stats("reward", (batch["token_level_rewards"].double() * mask).sum(-1)))
    return out


def advantage_metrics(batch: Batch) -> dict[str, float]:
    """``advantage/*``, ``return/*`` and ``value/*`` over response tokens."""
    mask = _response_mask(batch)
    if mask is None:
        return {}
    out: dict[str, float] = {}
    for column, name in (("advantages", "advantage"), ("returns", "return"), ("values", "value")):
        if column in batch:
            out.update(tensor_stats(name, batch[column], mask))
    return out


def zero_variance_group_fraction(scores: Tensor, group_ids: Tensor) -> float:
    """Fraction of groups whose samples all scored the same.

    Such a group gives every sample a zero group-relative advantage, so it teaches nothing; a fraction
    near 1 means the task is too easy or too hard for the current policy. A group of one sample counts
    as zero-variance.
    """
    index, num_groups = group_index(group_ids)
    scores = scores.double()
    empty = torch.zeros(num_groups, dtype=torch.float64)
    high = empty.scatter_reduce(0, index, scores, reduce="amax", include_self=False)
    low = empty.scatter_reduce(0, index, scores, reduce="amin", include_self=False)
    return (high == low).double().mean().item()


def group_metrics(batch: Batch) -> dict[str, float]:
    """``group/zero_variance_frac`` and ``group/count`` from ``group_ids`` and the sample scores."""
    scores = sequence_scores(batch)
    if scores is None or "group_ids" not in batch:
        return {}
    _, num_groups = group_index(batch["group_ids"])
    return {
        "group/zero_variance_frac": zero_variance_group_fraction(scores, batch["group_ids"]),
        "group/count": float(num_groups),
    }


def truncation_metrics(batch: Batch) -> dict[str, float]:
    """``response/truncation_rate``: fraction of samples stopped by the length limit (``finish_reason == "length"``)."""
    if "finish_reason" not in batch or len(batch) == 0:
        return {}
    reasons = np.asarray(batch["finish_reason"], dtype=object)
    return {"response/truncation_rate": float(np.mean(reasons == "length"))}


def response_length_metrics(batch: Batch) -> dict[str, float]:
    """``response_length/*``: generated tokens per sample."""
    mask = _response_mask(batch)
    return {} if mask is None else tensor_stats("response_length", mask.sum(-1))


def log_prob_gap_metrics(batch: Batch) -> dict[str, float]:
    """``sync/log_prob_abs_diff_mean`` and ``_max``: |rollout - recomputed| log-prob over response tokens.

    After a correct weight push the two agree to rounding (~1e-6 in fp32); a large gap means the engine
    sampled from different weights than the trainer holds. Only the tokens the engine sampled count
    (`hybridflow.contract.sampled_response_mask`: an episode's inserted ids have no engine log-prob).
    """
    mask = sampled_response_mask(batch) if "response_mask" in batch else None
    if mask is None or "rollout_log_probs" not in batch or "old_log_probs" not in batch or not mask.any():
        return {}
    gap = (batch["rollout_log_probs"].double() - batch["old_log_probs"].double()).abs()[mask]
    return {"sync/log_prob_abs_diff_mean": gap.mean().item(), "sync/log_prob_abs_diff_max": gap.max().item()}


def step_metrics(batch: Batch) -> dict[str, float]:
    """Every metric above that the batch's columns allow."""
    out: dict[str, float] = {}
    for fn in (
        reward_metrics,
        advantage_metrics,
        group_metrics,
        truncation_metrics,
        response_length_metrics,
        log_prob_gap_metrics,
    ):
        out.update(fn(batch))
    return out
