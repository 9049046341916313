"""Rollout correction: truncated importance weights between the rollout engine and the trainer.

The engine that samples (vLLM, often in bf16) and the trainer that recomputes the same tokens' log-probs
(FSDP2, often in fp32) are two numerical implementations of one policy; they disagree by a little on
every token. The samples therefore come from the engine's distribution ``pi_rollout``, while the policy
loss treats them as drawn from the trainer's ``pi_old``: a silent off-policy gap. Truncated importance
sampling (TIS; Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training",
2025) reweights each token's policy loss by the capped ratio of the two:

* ``token`` level: ``w_t = min(exp(old_t - rollout_t), C)``, one weight per response token;
* ``sequence`` level: ``w_i = min(exp(sum_t (old_it - rollout_it)), C)``, the importance ratio of the
  whole sampled response (the product of its token ratios), shared by all of its tokens.

``old`` and ``rollout`` are log-probs (nats) of the sampled tokens, under the trainer's pre-update
policy and under the engine. The weights carry no gradient: they correct the sampling distribution, the
policy loss keeps its own ratio ``pi / pi_old``. Truncating at ``C`` bounds the variance at the price of
a small bias (as in IMPALA's V-trace, Espeholt et al., arXiv:1802.01561); ``C = 2`` is the value the
TIS post uses. The sequence-level weight is the unbiased ratio for a sequence-level reward but its
variance grows with the length; it is truncated far more often than the token-level weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hybridflow.algos.masked import masked_mean, masked_sum

__all__ = ["ROLLOUT_CORRECTION_LEVELS", "rollout_correction_weights"]

ROLLOUT_CORRECTION_LEVELS = ("token", "sequence")
"""The levels :func:`rollout_correction_weights` accepts."""


def rollout_correction_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: str,
    cap: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Truncated importance weights of the trainer's policy against the engine's, per response token.

    Args:
        old_log_prob: ``[batch, response_len]`` log-probs (nats) of the sampled tokens under the
            trainer's pre-update policy (the policy loss's ``old_log_prob``).
        rollout_log_prob: ``[batch, response_len]`` the same tokens' log-probs as the engine reported
            them when sampling (the behaviour policy).
        response_mask: ``[batch, response_len]``, 1 for tokens that enter the loss.
        level: ``"token"`` (a weight per token) or ``"sequence"`` (one per row, repeated over its
            tokens); see the module docstring.
        cap: the truncation ``C > 0``: weights above it are set to it.

    Returns:
        ``weights [batch, response_len]``, detached, 1 at invalid tokens; and metrics, each a detached
        scalar mean over the valid tokens:

        * ``weight_mean``: the truncated weight;
        * ``truncated_frac``: share of tokens whose weight was capped (at sequence level, the tokens of
          capped sequences);
        * ``log_prob_gap_mean``: ``|old - rollout|`` (nats), the engine-vs-trainer gap;
        * ``log_ratio_mean``: ``old - rollout`` (nats), its sign says which side is more confident.

    Raises:
        ValueError: an unknown ``level``, a ``cap`` that is not positive, or inputs of different shapes.
    """
    if level not in ROLLOUT_CORRECTION_LEVELS:
        raise ValueError(
            f"rollout correction level must be one of {ROLLOUT_CORRECTION_LEVELS}, got {level!r}"
        )
    if not cap > 0:
        raise ValueError(f"rollout correction cap must be > 0, got {cap}")
    if not old_log_prob.shape == rollout_log_prob.shape == response_mask.shape:
        raise ValueError(
            "rollout correction inputs must share one [batch, response_len] shape; got "
            f"old_log_prob={tuple(old_log_prob.shape)}, rollout_log_prob={tuple(rollout_log_prob.shape)}, "
            f"response_mask={tuple(response_mask.shape)}"
        )
    valid = response_mask.bool()
    log_ratio = (old_log_prob.detach() - rollout_log_prob.detach()).where(valid, 0.0)
    if level == "token":
        log_weight = log_ratio
    else:
        log_weight = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    # Compared in log space: exp() of a long sequence's summed log-ratio may overflow to inf.
    truncated = (log_weight > math.log(cap)) & valid
    weights = torch.exp(log_weight).clamp(max=cap).where(valid, 1.0)
    metrics = {
        "weight_mean": masked_mean(weights, response_mask),
        "truncated_frac": masked_mean(truncated.to(weights.dtype), response_mask),
        "log_prob_gap_mean": masked_mean(log_ratio.abs(), response_mask),
        "log_ratio_mean": masked_mean(log_ratio, response_mask),
    }
    return weights, metrics
