"""Advantage estimators.

Calling convention (shared by every registered estimator, see :mod:`hybridflow.algos`)::

    advantages, returns = estimator(data, **params)

``data`` is any mapping-like object (a dict, a ``TensorDict``, a ``Batch``) that supports ``key in
data`` and ``data[key]``; the estimator reads only the keys it needs:

=======================  ============================  =========================================
key                      shape                         meaning
=======================  ============================  =========================================
``response_mask``        ``[batch, response_len]``     1 for real response tokens, 0 otherwise
``token_level_rewards``  ``[batch, response_len]``     reward per token (an outcome reward sits
                                                       at the last valid token)
``scores``               ``[batch]``                   outcome score per sequence (optional; if
                                                       absent, the masked sum of
                                                       ``token_level_rewards`` is used)
``values``               ``[batch, response_len]``     critic values V(s_t) (``gae`` only)
``group_ids``            ``[batch]`` / ``[batch, L]``  integer group ids (see
                                                       :mod:`hybridflow.algos.grouping`)
``kl``                   ``[batch, response_len]``     per-token KL to the reference policy in
                                                       nats, usually k1 (``reinforce_pp*`` with
                                                       ``kl_coef != 0``)
=======================  ============================  =========================================

When both ``scores`` and ``token_level_rewards`` are present, ``scores`` takes precedence (as the
outcome score, placed at the last valid token where token rewards are needed).

``params`` are keyword-only scalars from the config (``gamma``, ``lam``, ``norm_by_std``...). Both
outputs are ``[batch, response_len]`` and are 0 wherever ``response_mask`` is 0.

Masked positions inside a response (e.g. tool output in a multi-turn rollout) are *transparent* to
discounting: their reward is ignored and they do not consume a discount step, so ``gamma`` and ``lam``
act between consecutive valid tokens.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from hybridflow.algos.grouping import group_stats
from hybridflow.algos.masked import last_valid_token_mask, masked_sum, masked_whiten
from hybridflow.algos.registry import ADVANTAGE_ESTIMATORS, register_advantage_estimator

__all__ = [
    "compute_advantage",
    "discounted_returns",
    "gae",
    "grpo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "rloo",
]


def _require(data: Mapping[str, Tensor], key: str, who: str) -> Tensor:
    if key not in data:
        raise KeyError(f"advantage estimator {who!r} needs data[{key!r}], which is missing")
    return data[key]


def _response_mask(data: Mapping[str, Tensor], who: str, like: Tensor | None = None) -> Tensor:
    mask = _require(data, "response_mask", who).bool()
    if like is not None and like.shape != mask.shape:
        raise ValueError(f"{who}: shape {tuple(like.shape)} does not match response_mask {tuple(mask.shape)}")
    return mask


def _sequence_scores(data: Mapping[str, Tensor], mask: Tensor, who: str) -> Tensor:
    """``data['scores']`` if given, else the masked sum of ``token_level_rewards``: ``[batch]``."""
    if "scores" in data:
        scores = data["scores"]
        if scores.shape != mask.shape[:1]:
            raise ValueError(f"{who}: scores must be [batch]={mask.shape[0]}, got {tuple(scores.shape)}")
        return scores
    rewards = _require(data, "token_level_rewards", who)
    if rewards.shape != mask.shape:
        raise ValueError(
            f"{who}: token_level_rewards {tuple(rewards.shape)} does not match "
            f"response_mask {tuple(mask.shape)}"
        )
    return masked_sum(rewards, mask, dim=-1)


def _per_token(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """Broadcast a ``[batch]`` value to every valid token of its row."""
    expanded = per_sequence.unsqueeze(-1).expand(mask.shape)
    return torch.where(mask, expanded, torch.zeros_like(expanded))


def _token_rewards(data: Mapping[str, Tensor], mask: Tensor, who: str) -> Tensor:
    """Token-level rewards ``[batch, response_len]``: given ones, or ``scores`` at the last valid token."""
    if "token_level_rewards" in data and "scores" not in data:
        rewards = data["token_level_rewards"]
        if rewards.shape != mask.shape:
            raise ValueError(
                f"{who}: token_level_rewards {tuple(rewards.shape)} does not match "
                f"response_mask {tuple(mask.shape)}"
            )
        return torch.where(mask, rewards, torch.zeros_like(rewards))
    scores = _sequence_scores(data, mask, who)
    return _per_token(scores, last_valid_token_mask(mask))


def discounted_returns(token_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Reward-to-go over valid tokens.

    Args:
        token_rewards: ``[batch, response_len]`` reward per token.
        response_mask: ``[batch, response_len]``, 1 for valid tokens.
        gamma: discount per valid token.

    Returns:
        ``G [batch, response_len]`` with ``G_t = r_t + gamma * G_{t'}``, ``t'`` the next valid
        position after ``t`` (``G = 0`` past the last one); 0 at invalid positions, whose rewards
        are ignored. With ``gamma = 1`` this is the plain reverse cumulative sum.
    """
    mask = response_mask.bool()
    rewards = torch.where(mask, token_rewards, torch.zeros_like(token_rewards))
    if gamma == 1.0:
        # Invalid positions hold 0 reward and need no discount step, so a reverse cumsum is exact.
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
        return torch.where(mask, returns, torch.zeros_like(returns))
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(mask[:, t], running, torch.zeros_like(running))
    return returns


@register_advantage_estimator("gae")
def gae(
    data: Mapping[str, Tensor],
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Generalised Advantage Estimation (Schulman et al., "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation", arXiv:1506.02438).

    Reads ``token_level_rewards``, ``values`` and ``response_mask``, all ``[batch, response_len]``.

    Formula (over valid tokens, ``t'`` = next valid token, ``V_{t'} = A_{t'} = 0`` past the end):
    ``delta_t = r_t + gamma * V_{t'} - V_t``; ``A_t = delta_t + gamma * lam * A_{t'}``;
    ``returns_t = A_t + V_t`` (the critic's regression target, before whitening).
    With ``whiten=True`` the advantages are then normalised over all valid tokens of the batch,
    ``(A - mean) / sqrt(var + eps)`` (Bessel-corrected ``var``).

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    rewards = _require(data, "token_level_rewards", "gae")
    values = _require(data, "values", "gae")
    mask = _response_mask(data, "gae", like=rewards)
    if values.shape != mask.shape:
        raise ValueError(
            f"gae: values {tuple(values.shape)} does not match response_mask {tuple(mask.shape)}"
        )
    values = values.detach()

    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[-1])):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = torch.where(valid, adv, torch.zeros_like(adv))
        # Invalid steps leave the carried bootstrap untouched, so they are skipped, not zero-reward steps.
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, adv, next_adv)

    returns = torch.where(mask, advantages + values, torch.zeros_like(advantages))
    if whiten:
        advantages = masked_whiten(advantages, mask, eps=eps)
    return advantages, returns


@register_advantage_estimator("grpo", compares_group_samples=True)
def grpo(
    data: Mapping[str, Tensor],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Group-relative advantage of GRPO (Shao et al., "DeepSeekMath: Pushing the Limits of
    Mathematical Reasoning in Open Language Models", arXiv:2402.03300).

    Reads ``response_mask``, ``group_ids`` and the outcome score (``scores`` ``[batch]``, or the
    masked sum of ``token_level_rewards``).

    Formula, per sample ``i`` in (finest) group ``g``: ``A_i = (s_i - mean_g(s)) / (std_g(s) + eps)``
    with the Bessel-corrected group std; with ``norm_by_std=False``, ``A_i = s_i - mean_g(s)``,
    which is Dr. GRPO (Liu et al., "Understanding R1-Zero-Like Training: A Critical Perspective",
    arXiv:2503.20783). Groups of size 1 get ``A = 0``; groups may differ in size.
    ``A_i`` is copied to every valid token of sample ``i``; ``returns`` equals ``advantages``.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    mask = _response_mask(data, "grpo")
    scores = _sequence_scores(data, mask, "grpo")
    stats = group_stats(scores, _require(data, "group_ids", "grpo"))
    centred = scores - stats.mean
    adv = centred / (stats.std + eps) if norm_by_std else centred
    # A singleton's centred score is exactly 0 in exact arithmetic; pin it against rounding.
    adv = torch.where(stats.count > 1, adv, torch.zeros_like(adv))
    advantages = _per_token(adv, mask)
    return advantages, advantages.clone()


@register_advantage_estimator("rloo", compares_group_samples=True)
def rloo(data: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """REINFORCE Leave-One-Out (Kool et al., "Buy 4 REINFORCE Samples, Get a Baseline for Free!",
    ICLR 2019 workshop; Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization
    for Learning from Human Feedback in LLMs", arXiv:2402.14740).

    Reads ``response_mask``, ``group_ids`` and the outcome score (``scores`` or the masked sum of
    ``token_level_rewards``).

    Formula, per sample ``i`` in a (finest) group ``g`` of size ``n > 1``:
    ``A_i = s_i - (sum_{j in g, j != i} s_j) / (n - 1)``; groups of size 1 get ``A = 0`` (no
    other sample to form a baseline). ``A_i`` is copied to every valid token; ``returns`` equals
    ``advantages``.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    mask = _response_mask(data, "rloo")
    scores = _sequence_scores(data, mask, "rloo")
    stats = group_stats(scores, _require(data, "group_ids", "rloo"))
    loo_baseline = (stats.sum - scores) / (stats.count - 1).clamp(min=1)
    adv = torch.where(stats.count > 1, scores - loo_baseline, torch.zeros_like(scores))
    advantages = _per_token(adv, mask)
    return advantages, advantages.clone()


def _reinforce_pp_core(
    data: Mapping[str, Tensor],
    mask: Tensor,
    token_rewards: Tensor,
    *,
    gamma: float,
    kl_coef: float,
    eps: float,
    who: str,
) -> tuple[Tensor, Tensor]:
    if kl_coef != 0.0:
        kl = _require(data, "kl", who)
        if kl.shape != mask.shape:
            raise ValueError(f"{who}: kl {tuple(kl.shape)} does not match response_mask {tuple(mask.shape)}")
        token_rewards = token_rewards - kl_coef * kl
    returns = discounted_returns(token_rewards, mask, gamma)
    advantages = masked_whiten(returns, mask, eps=eps)
    return advantages, returns


@register_advantage_estimator("reinforce_pp")
def reinforce_pp(
    data: Mapping[str, Tensor],
    *,
    gamma: float = 1.0,
    kl_coef: float = 0.0,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models", arXiv:2501.03262).

    Reads ``response_mask``; ``scores`` (placed at the last valid token) or ``token_level_rewards``;
    and ``kl`` ``[batch, response_len]`` (nats, k1 = log pi_old - log pi_ref) when ``kl_coef != 0``.

    Formula: ``r_t = s * [t is last valid token] - kl_coef * kl_t``;
    ``G_t = sum_{k >= t valid} gamma^(#valid steps from t to k) r_k`` (:func:`discounted_returns`);
    ``A = (G - mean(G)) / sqrt(var(G) + eps)`` over all valid tokens of the batch (global whitening).

    Returns:
        ``(advantages, returns)`` with ``returns = G`` (before whitening), each
        ``[batch, response_len]``, 0 at invalid tokens.
    """
    mask = _response_mask(data, "reinforce_pp")
    token_rewards = _token_rewards(data, mask, "reinforce_pp")
    return _reinforce_pp_core(
        data, mask, token_rewards, gamma=gamma, kl_coef=kl_coef, eps=eps, who="reinforce_pp"
    )


@register_advantage_estimator("reinforce_pp_baseline", compares_group_samples=True)
def reinforce_pp_baseline(
    data: Mapping[str, Tensor],
    *,
    gamma: float = 1.0,
    kl_coef: float = 0.0,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline (arXiv:2501.03262, "REINFORCE++-baseline").

    Reads what :func:`reinforce_pp` reads, plus ``group_ids``.

    Formula: the sequence score ``s_i`` (``scores``, or the masked sum of ``token_level_rewards``)
    is replaced by ``s_i - mean_g(s)`` over its (finest) group ``g`` — done by subtracting
    ``mean_g(s)`` at the last valid token — then the same KL penalty, discounted return and global
    whitening as :func:`reinforce_pp`. Unlike GRPO there is no per-group std division; the global
    whitening sets the scale.

    Returns:
        ``(advantages, returns)`` with ``returns`` the discounted returns of the baselined rewards,
        each ``[batch, response_len]``, 0 at invalid tokens.
    """
    who = "reinforce_pp_baseline"
    mask = _response_mask(data, who)
    token_rewards = _token_rewards(data, mask, who)
    scores = _sequence_scores(data, mask, who)
    baseline = group_stats(scores, _require(data, "group_ids", who)).mean
    token_rewards = token_rewards - _per_token(baseline, last_valid_token_mask(mask))
    return _reinforce_pp_core(data, mask, token_rewards, gamma=gamma, kl_coef=kl_coef, eps=eps, who=who)


def compute_advantage(data: Mapping[str, Tensor], estimator: str, **params: Any) -> tuple[Tensor, Tensor]:
    """Look up ``estimator`` in ``ADVANTAGE_ESTIMATORS`` and call it as ``fn(data, **params)``.

    Args:
        data: mapping of tensors (see module docstring for the keys).
        estimator: registered name, e.g. ``"grpo"``.
        params: the estimator's keyword parameters.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``.

    Raises:
        UnknownNameError: the name is not registered (the message lists the valid ones).
        TypeError: a parameter the estimator does not accept (the message lists those it does),
            so a misspelt config key fails here instead of being silently ignored.
    """
    fn = ADVANTAGE_ESTIMATORS.get(estimator)
    accepted = _keyword_params(fn)
    if accepted is not None:
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            raise TypeError(
                f"advantage estimator {estimator!r} got unexpected parameter(s) {', '.join(unknown)}; "
                f"it accepts: {', '.join(accepted) or '(none)'}"
            )
    return fn(data, **params)  # type: ignore[return-value]


def _keyword_params(fn: Any) -> tuple[str, ...] | None:
    """Names ``fn`` accepts by keyword after ``data``; ``None`` if it takes ``**kwargs``."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    keyword_kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(p.name for p in parameters[1:] if p.kind in keyword_kinds)
