"""Policy-gradient losses.

Calling convention (shared by every registered policy loss)::

    loss, metrics = fn(log_prob, old_log_prob, advantages, response_mask,
                       loss_agg_mode="token-mean", global_token_count=None,
                       global_seq_count=None, norm_constant=None, **loss_params)

* ``log_prob``: ``[batch, response_len]`` log-probs (nats) of the sampled tokens under the policy
  being trained (carries the gradient);
* ``old_log_prob``: the same under the policy that generated the batch (no gradient);
* ``advantages``: ``[batch, response_len]``;
* ``response_mask``: ``[batch, response_len]``, 1 for tokens that enter the loss;
* the aggregation arguments are passed to :func:`hybridflow.algos.aggregation.aggregate_loss`.
  ``loss_agg_mode`` is a registered name or the aggregation function itself: the actor's
  `PolicyObjective` passes the function it resolved on the controller, so that a mode a recipe
  registered there works in the worker processes too. Hand it on to ``aggregate_loss`` (which
  takes either) rather than comparing it with names.

``loss`` is a scalar to minimise. ``metrics`` maps names to detached scalar tensors (no ``.item()``
here, so no device sync), each a mean over this call's valid tokens:

* ``clip_frac``: fraction of tokens whose loss term is clipped/truncated (passes no gradient or a
  truncated weight);
* ``approx_kl``: ``mean((r - 1) - log r)``, ``r = pi / pi_old``: k3 estimate of ``KL(pi_old || pi)``
  (nats), how far this update has moved the policy from the sampling one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hybridflow.algos.aggregation import AggregationMode, Count, aggregate_loss
from hybridflow.algos.masked import LOG_RATIO_CLAMP, masked_mean, masked_sum
from hybridflow.algos.registry import POLICY_LOSSES, register_policy_loss

__all__ = ["compute_policy_loss", "gspo_loss", "ppo_clip_loss", "reinforce_loss"]


def _check_shapes(log_prob: Tensor, old_log_prob: Tensor, advantages: Tensor, response_mask: Tensor) -> None:
    shapes = {
        "log_prob": log_prob.shape,
        "old_log_prob": old_log_prob.shape,
        "advantages": advantages.shape,
        "response_mask": response_mask.shape,
    }
    if len(set(shapes.values())) != 1:
        described = ", ".join(f"{k}={tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"policy loss inputs must share one [batch, response_len] shape; got {described}")


def _approx_kl(log_ratio: Tensor, mask: Tensor) -> Tensor:
    # k3 with r = pi/pi_old is non-negative per token, so a few tokens cannot cancel each other.
    kl = torch.expm1(log_ratio) - log_ratio
    return masked_mean(kl.detach(), mask)


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    dual_clip_c: float | None = None,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate (Schulman et al., "Proximal Policy Optimization Algorithms",
    arXiv:1707.06347) with clip-higher and dual clip.

    Per token, with ``r = exp(log_prob - old_log_prob)`` and advantage ``A``::

        l = max(-A * r, -A * clip(r, 1 - clip_eps_low, 1 + clip_eps_high))
        if A < 0 and dual_clip_c is set:  l = min(l, -A * dual_clip_c)

    * ``clip_eps_high`` > ``clip_eps_low`` is DAPO's clip-higher (Yu et al., "DAPO: An Open-Source
      LLM Reinforcement Learning System at Scale", arXiv:2503.14476): low-probability tokens with
      positive advantage may grow more, countering entropy collapse. ``None`` means equal to low.
    * Dual clip (Ye et al., "Mastering Complex Control in MOBA Games with Deep Reinforcement
      Learning", arXiv:1912.09729) bounds the loss of negative-advantage tokens whose ratio has
      grown huge, where the plain PPO term is unbounded. ``dual_clip_c`` must be > 1.

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with metrics
    ``clip_frac``, ``dual_clip_frac`` and ``approx_kl`` (see module docstring).
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    if clip_eps_low < 0 or high < 0:
        raise ValueError(f"clip ranges must be >= 0, got low={clip_eps_low}, high={high}")
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1, got {dual_clip_c}")

    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + high)
    loss_mat = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped

    if dual_clip_c is not None:
        bound = -advantages * dual_clip_c
        dual_active = (advantages < 0) & (loss_mat > bound)
        loss_mat = torch.where(dual_active, bound, loss_mat)
    else:
        dual_active = torch.zeros_like(clip_active)

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    metrics = {
        "clip_frac": masked_mean(clip_active.to(log_prob.dtype), response_mask),
        "dual_clip_frac": masked_mean(dual_active.to(log_prob.dtype), response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
    return loss, metrics


@register_policy_loss("gspo")
def gspo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float | None = 4e-4,
    loss_agg_mode: AggregationMode = "seq-mean-token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Group Sequence Policy Optimization (Zheng et al., "Group Sequence Policy Optimization",
    arXiv:2507.18071), in its token form "GSPO-token".

    The importance ratio is the sequence's geometric mean of token ratios,
    ``s_i = exp(mean_{t valid} (log_prob_it - old_log_prob_it))``. Each token uses
    ``s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]`` (``sg`` = stop-gradient): numerically ``s_i``,
    with gradient ``s_i * grad log pi(y_it)``. Then per token::

        l = max(-A * s_it, -A * clip(s_it, 1 - clip_eps_low, 1 + clip_eps_high))

    With sequence-constant advantages and ``seq-mean-token-mean`` (the default, as in the paper)
    this equals the sequence-level GSPO objective; the token form also admits per-token
    advantages. The clip ranges are ~1e-4 because a sequence ratio moves far less than a token
    ratio (paper defaults 3e-4 / 4e-4).

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with
    ``clip_frac`` (fraction of valid tokens in clipped terms) and ``approx_kl`` (token-level).
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    if clip_eps_low < 0 or high < 0:
        raise ValueError(f"clip ranges must be >= 0, got low={clip_eps_low}, high={high}")

    token_log_ratio = log_prob - old_log_prob
    lengths = masked_sum(torch.ones_like(log_prob), response_mask, dim=-1).clamp(min=1)
    seq_log_ratio = masked_sum(token_log_ratio, response_mask, dim=-1) / lengths
    combined = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(combined.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))

    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + high)
    loss_mat = torch.maximum(unclipped, clipped)
    clip_active = clipped > unclipped

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    token_log_ratio = token_log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    metrics = {
        "clip_frac": masked_mean(clip_active.to(log_prob.dtype), response_mask),
        "approx_kl": _approx_kl(token_log_ratio, response_mask),
    }
    return loss, metrics


@register_policy_loss("reinforce")
def reinforce_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    max_importance_weight: float | None = None,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE with per-token importance weights (Williams, "Simple Statistical Gradient-Following
    Algorithms for Connectionist Reinforcement Learning", 1992), optionally truncated.

    Per token, with ``w = sg[min(r, max_importance_weight)]``, ``r = pi / pi_old`` (``w = sg[r]``
    when ``max_importance_weight`` is ``None``)::

        l = -A * w * pi / sg[pi]        # value -A * w, gradient -A * w * grad log pi

    The weight corrects for sampling from ``pi_old`` and carries no gradient itself; truncating it
    trades a little bias for bounded variance (truncated importance sampling, as in IMPALA,
    Espeholt et al., arXiv:1802.01561). On-policy (``pi == pi_old``) this is plain
    ``-A * grad log pi``.

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with
    ``clip_frac`` (fraction of tokens whose weight was truncated) and ``approx_kl``.
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    if max_importance_weight is not None and max_importance_weight <= 0:
        raise ValueError(f"max_importance_weight must be > 0, got {max_importance_weight}")

    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    weight = torch.exp(log_ratio.detach())
    if max_importance_weight is not None:
        truncated = weight > max_importance_weight
        weight = weight.clamp(max=max_importance_weight)
    else:
        truncated = torch.zeros_like(weight, dtype=torch.bool)
    # exp(x - sg[x]) is 1 in value and has gradient grad x: the loss reads -A * w, the gradient
    # is the importance-weighted score function.
    loss_mat = -advantages * weight * torch.exp(log_prob - log_prob.detach())

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    metrics = {
        "clip_frac": masked_mean(truncated.to(log_prob.dtype), response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
    return loss, metrics


def compute_policy_loss(
    name: str | Callable[..., tuple[Tensor, dict[str, Tensor]]],
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    **kwargs: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Call the policy loss registered as ``name`` (see module docstring for the convention); a
    function in place of the name is called as it is.

    Raises:
        UnknownNameError: unknown ``name`` (the message lists the valid ones).
    """
    fn = POLICY_LOSSES.resolve(name)
    return fn(log_prob, old_log_prob, advantages, response_mask, **kwargs)  # type: ignore[return-value]
