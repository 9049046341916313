"""Policy-gradient losses.

Calling convention (shared by every registered policy loss)::

    loss, metrics = fn(log_prob, old_log_prob, advantages, response_mask,
                       loss_agg_mode="token-mean", global_token_count=None,
                       global_seq_count=None, norm_constant=None, **loss_params)

* ``log_prob``: ``[batch, response_len]`` log-probs (nats) of the sampled tokens under the policy
  being trained (carries the gradient);
* ``old_log_prob``: the same under the policy that generated the batch (no gradient);
* ``advantages``: ``[batch, response_len]``;
* ``response_mask``: ``[batch, response_len]``, 1 for tokens that enter the loss, or per-token loss
  weights >= 0 (a step's ``loss_mask``): the weight multiplies the token's loss term, through the
  aggregation, and everything else a loss computes from the mask (the sequence ratios of ``gspo`` and
  ``gmpo``, the covariance selection of ``clip_cov`` and ``kl_cov``, the metrics) is taken over the
  tokens with a non-zero weight, each counted once, so it does not depend on the weights' values;
* the aggregation arguments are passed to :func:`hybridflow.algos.aggregation.aggregate_loss`.
  ``loss_agg_mode`` is a registered name or the aggregation function itself: the actor's
  `PolicyObjective` passes the function it resolved on the controller, so that a mode a recipe
  registered there works in the worker processes too. Hand it on to ``aggregate_loss`` (which
  takes either) rather than comparing it with names.

``loss`` is a scalar to minimise. ``metrics`` maps names to detached scalar tensors (no ``.item()``
here, so no device sync; only ``clip_cov`` and ``kl_cov`` read a token count to size their selection),
each a mean over this call's valid tokens:

* ``clip_frac`` (losses that clip): fraction of tokens whose loss term is clipped/truncated (passes
  no gradient or a truncated weight);
* ``approx_kl`` (all): ``mean((r - 1) - log r)``, ``r = pi / pi_old``: k3 estimate of
  ``KL(pi_old || pi)`` (nats), how far this update has moved the policy from the sampling one;
* loss-specific ones, named in each docstring (``dual_clip_frac``, ``soft_gate_weight``,
  ``cov_clip_frac``, ``kl_cov_frac``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hybridflow.algos.aggregation import AggregationMode, Count, aggregate_loss
from hybridflow.algos.masked import LOG_RATIO_CLAMP, masked_mean, masked_sum
from hybridflow.algos.registry import POLICY_LOSSES, register_policy_loss

__all__ = [
    "cispo_loss",
    "clip_cov_loss",
    "compute_policy_loss",
    "gmpo_loss",
    "gspo_loss",
    "kl_cov_loss",
    "ppo_clip_loss",
    "reinforce_loss",
    "sapo_loss",
    "token_covariance",
]


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


@register_policy_loss("cispo")
def cispo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_eps_low: float | None = None,
    clip_eps_high: float = 3.0,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped IS-weight Policy Optimization (MiniMax, "MiniMax-M1: Scaling Test-Time Compute
    Efficiently with Lightning Attention", arXiv:2506.13585).

    Per token, with ``r = pi / pi_old`` and ``w = sg[clip(r, 1 - clip_eps_low, 1 + clip_eps_high)]``::

        l = -A * w * log_prob        # gradient -A * w * grad log pi

    PPO drops the gradient of a token whose ratio left the clip range; CISPO instead bounds the
    token's (detached) importance weight and keeps its REINFORCE gradient, so rare tokens that
    change fast still learn. ``clip_eps_low=None`` sets no lower bound, as in the paper, which tunes
    only the upper one and does not publish its value; the default upper bound ``w <= 4``
    (``clip_eps_high=3``) is the cap used for CISPO in ScaleRL (Khatri et al., "The Art of Scaling
    Reinforcement Learning Compute for LLMs", arXiv:2510.13786). The loss value is the paper's
    surrogate ``-A w log pi``, not ``-A w`` as in ``reinforce``; only the gradient is comparable.

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with ``clip_frac``
    (fraction of valid tokens whose weight was clipped) and ``approx_kl``.
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    if clip_eps_high < 0 or (clip_eps_low is not None and not 0 <= clip_eps_low <= 1):
        raise ValueError(
            f"cispo: clip_eps_high must be >= 0 and clip_eps_low in [0, 1] or None; "
            f"got low={clip_eps_low}, high={clip_eps_high}"
        )
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio.detach())
    lower = 0.0 if clip_eps_low is None else 1.0 - clip_eps_low
    weight = ratio.clamp(lower, 1.0 + clip_eps_high)
    loss_mat = -advantages * weight * log_prob

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    metrics = {
        "clip_frac": masked_mean((weight != ratio).to(log_prob.dtype), response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
    return loss, metrics


@register_policy_loss("sapo")
def sapo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_agg_mode: AggregationMode = "seq-mean-token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Soft Adaptive Policy Optimization (Gao et al., "Soft Adaptive Policy Optimization",
    arXiv:2511.20347).

    Per token, with ``r = pi / pi_old`` and ``tau = tau_pos`` if ``A > 0`` else ``tau_neg``::

        f(r) = sigmoid(tau * (r - 1)) * 4 / tau
        l    = -A * f(r)

    The smooth gate replaces PPO's hard clip: the gradient is ``-A * g * r * grad log pi`` with
    ``g = 4 p (1 - p)``, ``p = sigmoid(tau (r - 1))``, which is 1 on-policy (``r = 1``, plain
    policy gradient) and decays smoothly as the ratio moves away, faster for larger ``tau``.
    ``tau_neg > tau_pos`` damps negative-advantage tokens more, whose updates spread probability over
    many unsampled tokens. Defaults are the paper's (``tau_pos = 1``, ``tau_neg = 1.05``, and the
    per-sequence mean ``seq-mean-token-mean``).

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with
    ``soft_gate_weight`` (mean of ``g`` over valid tokens; nothing is hard-clipped) and
    ``approx_kl``.
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo: temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate_prob = torch.sigmoid(tau * (ratio - 1.0))
    loss_mat = -advantages * gate_prob * (4.0 / tau)

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    gate_weight = 4.0 * gate_prob * (1.0 - gate_prob)
    metrics = {
        "soft_gate_weight": masked_mean(gate_weight.detach(), response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
    return loss, metrics


@register_policy_loss("gmpo")
def gmpo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_eps_low: float = 0.4,
    clip_eps_high: float | None = None,
    loss_agg_mode: AggregationMode = "seq-mean-token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Geometric-Mean Policy Optimization (Zhao et al., "Geometric-Mean Policy Optimization",
    arXiv:2507.20673).

    The sequence ratio is the geometric mean of its token ratios, each clipped pessimistically in
    log space: with ``d_t = log_prob_t - old_log_prob_t``::

        d'_t = min(d_t, clip_eps_high)  if A_t >= 0        d'_t = max(d_t, -clip_eps_low)  if A_t < 0
        rho_i = exp(mean_{t valid} d'_it)
        l_it  = -A_it * rho_i

    A clipped token's ``d'`` is a constant, so it passes no gradient; an unclipped one gets
    ``-A * rho_i / n_i * grad log pi``. A geometric mean is far less moved by one outlier token
    ratio than GRPO's arithmetic mean. ``seq-mean-token-mean`` (the default, the paper's
    ``1/G sum_i``) gives each sequence ``-mean_t(A_it) * rho_i``; ``token-mean`` would weight
    sequences by length. ``clip_eps_high=None`` means equal to low; the paper's range is
    ``(e^-0.4, e^0.4)``.

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with ``clip_frac``
    (fraction of valid tokens whose log-ratio was clipped) and ``approx_kl`` (token-level).
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    if clip_eps_low < 0 or high < 0:
        raise ValueError(f"gmpo: clip ranges must be >= 0, got low={clip_eps_low}, high={high}")
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    positive = advantages >= 0
    clip_active = torch.where(positive, log_ratio > high, log_ratio < -clip_eps_low)
    bound = torch.where(positive, high, -clip_eps_low).to(log_ratio.dtype)
    pessimistic = torch.where(clip_active, bound, log_ratio)
    lengths = masked_sum(torch.ones_like(log_prob), response_mask, dim=-1).clamp(min=1)
    seq_ratio = torch.exp(masked_sum(pessimistic, response_mask, dim=-1) / lengths)
    loss_mat = -advantages * seq_ratio.unsqueeze(-1)

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    metrics = {
        "clip_frac": masked_mean(clip_active.to(log_prob.dtype), response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
    return loss, metrics


def token_covariance(log_prob: Tensor, advantages: Tensor, response_mask: Tensor) -> Tensor:
    """Per-token covariance term of log-probability and advantage (Cui et al., arXiv:2505.22617).

    ``cov_t = (log_prob_t - mean(log_prob)) * (A_t - mean(A))``, means over the valid tokens of the
    whole input; the batch mean of ``cov`` is the (biased) covariance whose sign drives the change
    of policy entropy. Detached.

    Shapes: inputs ``[batch, response_len]`` (log-probs in nats) -> ``[batch, response_len]``, 0 at
    invalid tokens.
    """
    log_prob = log_prob.detach()
    advantages = advantages.detach()
    centred = (log_prob - masked_mean(log_prob, response_mask)) * (
        advantages - masked_mean(advantages, response_mask)
    )
    return torch.where(response_mask.bool(), centred, torch.zeros_like(centred))


@register_policy_loss("clip_cov")
def clip_cov_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float | None = None,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clip-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv:2505.22617).

    The PPO clipped surrogate (:func:`ppo_clip_loss`, without dual clip), in which a random share of
    the high-covariance tokens pass no gradient. With ``cov`` from :func:`token_covariance` and
    ``N`` the valid tokens of this call, the candidates are the valid tokens that PPO did not clip
    and whose ``clip_cov_lb < cov < clip_cov_ub``; ``max(1, floor(clip_cov_ratio * N))`` of them,
    drawn uniformly without replacement (from ``generator`` if given), keep their loss value but are
    detached. Tokens that are both likely and well rewarded have large positive ``cov`` and are
    what drives entropy down; freezing a few of them keeps entropy from collapsing. The defaults are
    the paper's (``r = 2e-4``, ``omega_low = 1``, ``omega_high = 5``); the statistics are taken
    over the tokens of this call (one micro-batch), as in the authors' implementation.

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with ``clip_frac``
    (fraction of valid tokens passing no gradient, by either clip), ``cov_clip_frac`` (those
    detached for their covariance) and ``approx_kl``.
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    high = clip_eps_low if clip_eps_high is None else clip_eps_high
    if clip_eps_low < 0 or high < 0:
        raise ValueError(f"clip_cov: clip ranges must be >= 0, got low={clip_eps_low}, high={high}")
    if not 0 <= clip_cov_ratio <= 1 or clip_cov_lb >= clip_cov_ub:
        raise ValueError(
            f"clip_cov: clip_cov_ratio must be in [0, 1] and clip_cov_lb < clip_cov_ub; got "
            f"ratio={clip_cov_ratio}, lb={clip_cov_lb}, ub={clip_cov_ub}"
        )
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + high)
    loss_mat = torch.maximum(unclipped, clipped)
    ppo_clipped = clipped > unclipped

    valid = response_mask.bool()
    cov = token_covariance(log_prob, advantages, response_mask)
    candidates = valid & ~ppo_clipped & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    budget = max(1, int(clip_cov_ratio * int(valid.sum())))
    frozen = _random_subset(candidates, budget, generator)
    loss_mat = torch.where(frozen, loss_mat.detach(), loss_mat)

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    metrics = {
        "clip_frac": masked_mean((ppo_clipped | frozen).to(log_prob.dtype), response_mask),
        "cov_clip_frac": masked_mean(frozen.to(log_prob.dtype), response_mask),
        "approx_kl": _approx_kl(log_ratio, response_mask),
    }
    return loss, metrics


def _random_subset(candidates: Tensor, count: int, generator: torch.Generator | None) -> Tensor:
    """A bool tensor shaped like ``candidates`` marking ``min(count, #candidates)`` of its True
    entries, drawn uniformly without replacement."""
    flat = candidates.flatten().nonzero().squeeze(-1)
    device = generator.device if generator is not None else torch.device("cpu")
    order = torch.randperm(flat.numel(), generator=generator, device=device).to(flat.device)
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    chosen[flat[order[:count]]] = True
    return chosen.view_as(candidates)


@register_policy_loss("kl_cov")
def kl_cov_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    kl_cov_ratio: float = 2e-3,
    kl_coef: float = 1.0,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov (Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models", arXiv:2505.22617).

    The unclipped importance-weighted policy gradient, plus a KL penalty on the tokens of highest
    covariance. Per token, with ``r = pi / pi_old``::

        l = -A * r + kl_coef * |log r| * [t in top-k by cov]

    ``cov`` is :func:`token_covariance`; the top ``k = max(1, floor(kl_cov_ratio * N))`` of the ``N``
    valid tokens of this call are penalised, ``|log r|`` being the authors' per-token estimate of
    ``KL(pi_old || pi)``. Its gradient ``kl_coef * sign(log r) * grad log pi`` pulls those tokens back
    towards ``pi_old`` once the policy has moved (it is 0 at ``r = 1``). Defaults are the paper's
    (``k = 2e-3`` of the tokens, its 7B setting; ``beta = 1``); statistics are over the tokens of
    this call.

    Shapes: inputs ``[batch, response_len]``; returns ``(scalar loss, metrics)`` with
    ``kl_cov_frac`` (fraction of valid tokens penalised; nothing is clipped) and ``approx_kl``.
    """
    _check_shapes(log_prob, old_log_prob, advantages, response_mask)
    if not 0 <= kl_cov_ratio <= 1 or kl_coef < 0:
        raise ValueError(
            f"kl_cov: kl_cov_ratio must be in [0, 1] and kl_coef >= 0; got ratio={kl_cov_ratio}, "
            f"kl_coef={kl_coef}"
        )
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    valid = response_mask.bool()
    num_valid = int(valid.sum())
    cov = token_covariance(log_prob, advantages, response_mask)
    ranked = torch.where(valid, cov, torch.full_like(cov, -torch.inf)).flatten()
    top = torch.topk(ranked, min(num_valid, max(1, int(kl_cov_ratio * num_valid)))).indices
    penalised = torch.zeros_like(ranked, dtype=torch.bool)
    penalised[top] = True
    penalised = penalised.view_as(valid)
    penalty = torch.where(penalised, kl_coef * log_ratio.abs(), torch.zeros_like(log_ratio))
    loss_mat = -advantages * ratio + penalty

    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    metrics = {
        "kl_cov_frac": masked_mean(penalised.to(log_prob.dtype), response_mask),
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
