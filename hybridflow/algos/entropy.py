"""Policy entropy and the entropy bonus."""

from __future__ import annotations

import torch
from torch import Tensor

from hybridflow.algos.aggregation import AggregationMode, Count, aggregate_loss

__all__ = ["entropy_bonus", "entropy_from_logits"]


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy (nats) of the categorical distribution given by ``logits`` over the last dim.

    Shapes: ``[..., vocab]`` -> ``[...]`` (e.g. ``[batch, response_len, vocab]`` ->
    ``[batch, response_len]``).

    Formula: ``H = -sum_v p_v log p_v = logsumexp(z) - sum_v softmax(z)_v * z_v``, which needs one
    softmax and never takes the log of a (possibly underflowed) probability.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def entropy_bonus(
    response_mask: Tensor,
    *,
    coef: float,
    logits: Tensor | None = None,
    entropy: Tensor | None = None,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Entropy bonus term to ADD to the loss: ``-coef * agg(H)``.

    Maximising entropy keeps the policy exploring (Williams & Peng, "Function Optimization Using
    Connectionist Reinforcement Learning Algorithms", 1991; Mnih et al., "Asynchronous Methods for
    Deep Reinforcement Learning", arXiv:1602.01783); the minus sign turns that into a term of a
    loss that is minimised.

    Args:
        response_mask: ``[batch, response_len]``, 0/1 or per-token loss weights >= 0: a token's
            weight multiplies its bonus; the counts are of the tokens with a non-zero weight
            (:mod:`hybridflow.algos.aggregation`).
        coef: bonus coefficient (>= 0 for a bonus).
        logits: ``[batch, response_len, vocab]``; or
        entropy: per-token entropy ``[batch, response_len]`` in nats (e.g. computed by the model
            worker in chunks). Exactly one of ``logits`` / ``entropy`` must be given.
        loss_agg_mode, global_token_count, global_seq_count, norm_constant: see
            :func:`hybridflow.algos.aggregation.aggregate_loss`.

    Returns:
        ``(loss_term, mean_entropy)``: the scalar to add to the loss (with gradient) and the
        entropy in nats, detached, for logging: the same aggregation over the tokens with a non-zero
        weight, each counted once (unweighted), so that it stays a policy entropy whatever the weights.
    """
    if (logits is None) == (entropy is None):
        raise ValueError("entropy_bonus needs exactly one of logits= or entropy=")
    if entropy is None:
        assert logits is not None
        entropy = entropy_from_logits(logits)
    counts = (global_token_count, global_seq_count, norm_constant)
    weighted = aggregate_loss(entropy, response_mask, loss_agg_mode, *counts)
    mean_entropy = aggregate_loss(entropy.detach(), response_mask != 0, loss_agg_mode, *counts)
    return -coef * weighted, mean_entropy
