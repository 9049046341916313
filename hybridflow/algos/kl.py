"""KL-divergence estimators between the policy and a reference policy, and the KL-in-reward penalty.

All estimators take per-token log-probabilities (nats) of the SAMPLED tokens under the current policy
``pi`` and the reference ``pi_ref``, both ``[batch, response_len]``, and return a per-token estimate
``[batch, response_len]`` of ``KL(pi || pi_ref)`` for samples drawn from ``pi``. They are
J. Schulman's estimators from "Approximating KL Divergence" (blog post, 2020,
http://joschu.net/blog/kl-approx.html). With ``delta = log pi_ref - log pi`` (log of ``r = pi_ref/pi``):

==== ======================================= =========================================
k1   ``-delta = log pi - log pi_ref``         unbiased, high variance, can be negative
k2   ``delta^2 / 2``                          biased (low for small KL), low variance, >= 0
k3   ``exp(delta) - delta - 1``               unbiased, low variance, >= 0
==== ======================================= =========================================

Estimators ignore the mask: reduce the result with :func:`hybridflow.algos.aggregation.aggregate_loss`
or mask it in :func:`apply_kl_penalty`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hybridflow.algos.masked import LOG_RATIO_CLAMP
from hybridflow.algos.registry import KL_ESTIMATORS, register_kl_estimator

__all__ = ["apply_kl_penalty", "compute_kl", "kl_k1", "kl_k2", "kl_k3"]


def _check(log_prob: Tensor, ref_log_prob: Tensor) -> None:
    if log_prob.shape != ref_log_prob.shape:
        raise ValueError(
            f"log_prob {tuple(log_prob.shape)} and ref_log_prob {tuple(ref_log_prob.shape)} differ in shape"
        )


@register_kl_estimator("k1")
def kl_k1(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k1 = ``log_prob - ref_log_prob`` (nats), per token ``[batch, response_len]``.

    Unbiased estimate of ``KL(pi || pi_ref)`` under samples from ``pi`` (Schulman, "Approximating
    KL Divergence", 2020). Its gradient is the score function, so used as a *loss* it does not
    minimise the KL; use it in the reward (REINFORCE++, PPO-RLHF) rather than in the loss.
    """
    _check(log_prob, ref_log_prob)
    return log_prob - ref_log_prob


@register_kl_estimator("k2")
def kl_k2(log_prob: Tensor, ref_log_prob: Tensor) -> Tensor:
    """k2 = ``0.5 * (log_prob - ref_log_prob)^2`` (nats), per token ``[batch, response_len]``.

    Low-variance, non-negative, biased estimate of ``KL(pi || pi_ref)`` (Schulman, 2020); its
    gradient equals that of the true KL in expectation, which makes it a sound KL *loss*.
    """
    _check(log_prob, ref_log_prob)
    return 0.5 * (log_prob - ref_log_prob) ** 2


@register_kl_estimator("k3")
def kl_k3(log_prob: Tensor, ref_log_prob: Tensor, *, clamp: float | None = 10.0) -> Tensor:
    """k3 = ``exp(ref - logp) - (ref - logp) - 1`` (nats), per token ``[batch, response_len]``.

    Unbiased, low-variance, non-negative estimate of ``KL(pi || pi_ref)`` (Schulman, 2020); the
    "low_var_kl" of GRPO (arXiv:2402.03300, eq. 4).

    Stability: ``ref - logp`` is clamped to ``+-20`` before ``exp`` so the result is always
    finite, and the estimate is clamped to ``[0, clamp]`` (``None``: no upper clamp). Tokens that
    hit the clamp pass no gradient; they are the rare ones where the reference finds the sampled
    token ``e^10`` times likelier, whose exponential gradient would dominate a step.
    """
    _check(log_prob, ref_log_prob)
    delta = (ref_log_prob - log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kl = torch.exp(delta) - delta - 1.0
    return kl.clamp(min=0.0, max=clamp)


def compute_kl(
    log_prob: Tensor, ref_log_prob: Tensor, estimator: str | Callable[..., Tensor] = "k3", **kwargs: Any
) -> Tensor:
    """Per-token KL ``[batch, response_len]`` (nats) with the estimator registered as ``estimator``
    (or, given a function instead of a name, with that function).

    Raises:
        UnknownNameError: unknown estimator (the message lists the valid ones).
    """
    return KL_ESTIMATORS.resolve(estimator)(log_prob, ref_log_prob, **kwargs)  # type: ignore[return-value]


def apply_kl_penalty(
    token_rewards: Tensor, kl: Tensor, coef: float, response_mask: Tensor | None = None
) -> Tensor:
    """KL-in-reward: ``r'_t = r_t - coef * kl_t`` per token.

    Args:
        token_rewards: ``[batch, response_len]`` token-level rewards.
        kl: ``[batch, response_len]`` per-token KL in nats (usually k1, see :func:`kl_k1`).
        coef: penalty coefficient beta (a float, or a controller's ``.value``).
        response_mask: optional ``[batch, response_len]``; invalid positions of the result are 0.

    The per-token penalty of Ziegler et al., "Fine-Tuning Language Models from Human Preferences"
    (arXiv:1909.08593) and Ouyang et al. (arXiv:2203.02155): ``R(x, y) = r(x, y) - beta * KL``.
    """
    if token_rewards.shape != kl.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)} and kl {tuple(kl.shape)} differ in shape"
        )
    penalised = token_rewards - coef * kl
    if response_mask is not None:
        penalised = torch.where(response_mask.bool(), penalised, torch.zeros_like(penalised))
    return penalised
