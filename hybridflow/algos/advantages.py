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
``scores``               ``[batch]``                   outcome score per sequence (used only
                                                       when ``token_level_rewards`` is absent)
``values``               ``[batch, response_len]``     critic values V(s_t) (``gae`` only)
``group_ids``            ``[batch]`` / ``[batch, L]``  integer group ids (see
                                                       :mod:`hybridflow.algos.grouping`)
``kl``                   ``[batch, response_len]``     per-token KL to the reference policy in
                                                       nats, usually k1 (``reinforce_pp*`` with
                                                       ``kl_coef != 0``)
``baseline_scores``      ``[batch]``                   score of the greedy response to the row's
                                                       prompt (``remax`` only)
=======================  ============================  =========================================

When both ``scores`` and ``token_level_rewards`` are present, ``token_level_rewards`` takes precedence:
it is what shaping and an in-reward KL penalty write, and ``scores`` (the raw outcome score) would drop
them. An outcome score is the masked sum of ``token_level_rewards``; ``scores`` alone is placed at the last
valid token where token rewards are needed.

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

from hybridflow.algos.grouping import group_index, group_stats
from hybridflow.algos.masked import last_valid_token_mask, masked_sum, masked_whiten
from hybridflow.algos.registry import ADVANTAGE_ESTIMATORS, register_advantage_estimator

__all__ = [
    "compute_advantage",
    "discounted_returns",
    "gae",
    "gpg",
    "grpo",
    "opo",
    "pass_at_k",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
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
    """The masked sum of ``token_level_rewards`` if given, else ``data['scores']``: ``[batch]``."""
    if "scores" in data and "token_level_rewards" not in data:
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
    if "token_level_rewards" in data:
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


@register_advantage_estimator("remax")
def remax(data: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """ReMax (Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models", arXiv:2310.10505).

    Reads ``response_mask``, the outcome score (``scores`` ``[batch]``, or the masked sum of
    ``token_level_rewards``) and ``baseline_scores [batch]``: the score of the greedy (argmax-decoded)
    response to the row's prompt, repeated on every sampled row of that prompt.

    Formula: ``A_i = s_i - b_i`` with ``b_i`` the greedy response's score, copied to every valid token
    of sample ``i``; ``returns`` equals ``advantages``. The greedy response is a per-prompt baseline
    that needs no critic and no second sample, so ReMax works with one sample per prompt.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    mask = _response_mask(data, "remax")
    scores = _sequence_scores(data, mask, "remax")
    baseline = _require(data, "baseline_scores", "remax")
    if baseline.shape != scores.shape:
        raise ValueError(
            f"remax: baseline_scores must be [batch]={scores.shape[0]}, got {tuple(baseline.shape)}"
        )
    advantages = _per_token(scores - baseline.to(scores.dtype), mask)
    return advantages, advantages.clone()


@register_advantage_estimator("opo", compares_group_samples=True)
def opo(data: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al., "On-Policy RL with Optimal Reward
    Baseline", arXiv:2505.23585).

    Reads ``response_mask``, ``group_ids`` and the outcome score (``scores`` or the masked sum of
    ``token_level_rewards``).

    Formula, per sample ``i`` in (finest) group ``g``, with ``l_j`` the number of valid tokens of
    sample ``j``: ``b_g = sum_{j in g} l_j s_j / sum_{j in g} l_j`` and ``A_i = s_i - b_g``. This is
    the variance-minimising baseline ``E[|grad log pi|^2 s] / E[|grad log pi|^2]`` under the
    paper's approximation that the squared gradient norm of a response grows with its length.
    Groups of size 1 get ``A = 0`` (their baseline is their own score); a group whose responses are
    all empty has no valid token to carry an advantage. ``returns`` equals ``advantages``.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    mask = _response_mask(data, "opo")
    scores = _sequence_scores(data, mask, "opo")
    index, num_groups = group_index(_require(data, "group_ids", "opo").to(scores.device))
    if index.shape[0] != scores.shape[0]:
        raise ValueError(f"opo: group_ids has {index.shape[0]} rows but the batch has {scores.shape[0]}")
    # float64: the weighted sums of a large group of near-equal scores cancel in the subtraction.
    lengths = mask.sum(dim=-1).to(torch.float64)
    s = scores.to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=s.device)
    weighted = zeros.index_add(0, index, lengths * s)
    total_length = zeros.index_add(0, index, lengths)
    count = zeros.index_add(0, index, torch.ones_like(s))
    baseline = weighted / total_length.clamp(min=1)
    adv = torch.where(count[index] > 1, s - baseline[index], torch.zeros_like(s)).to(scores.dtype)
    advantages = _per_token(adv, mask)
    return advantages, advantages.clone()


@register_advantage_estimator("gpg", compares_group_samples=True)
def gpg(data: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Group Policy Gradient (Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline
    for Model Reasoning", arXiv:2504.02546).

    Reads ``response_mask``, ``group_ids`` and the outcome score (``scores`` or the masked sum of
    ``token_level_rewards``).

    Formula, per sample ``i`` in (finest) group ``g``: ``A_i = alpha * (s_i - mean_g(s))`` (the
    paper's ``F_norm = 1``: no division by the group std), with ``alpha = B / (B - M)``, ``B`` the
    samples of the batch that have a valid token and ``M`` those among them whose centred score is
    0 (all groups whose scores are equal, singletons included, give only such samples). The
    ``M`` invalid samples pass no gradient, so ``alpha`` rescales the batch gradient back to what the
    ``B - M`` valid samples would give on their own; ``alpha = 1`` when no sample is valid. The paper
    pairs this with the plain policy gradient (the ``reinforce`` loss). ``returns`` equals
    ``advantages``.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    mask = _response_mask(data, "gpg")
    scores = _sequence_scores(data, mask, "gpg")
    stats = group_stats(scores, _require(data, "group_ids", "gpg"))
    # An all-equal group has centred scores of exactly 0 in exact arithmetic; pin them against rounding
    # so that they are counted as invalid.
    centred = torch.where(stats.std > 0, scores - stats.mean, torch.zeros_like(scores))
    has_tokens = mask.any(dim=-1)
    batch_size = int(has_tokens.sum())
    valid = int((has_tokens & (centred != 0)).sum())
    alpha = batch_size / valid if valid > 0 else 1.0
    advantages = _per_token(alpha * centred, mask)
    return advantages, advantages.clone()


def _binary_scores(scores: Tensor, who: str) -> Tensor:
    """``scores`` as a bool tensor; raises naming the first row whose score is neither 0 nor 1."""
    bad = ~((scores == 0) | (scores == 1))
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"{who}: needs binary (0/1) scores, but row {row} has score {scores[row].item()}")
    return scores == 1


def _ratio_of_binomials(top: Tensor, bottom: Tensor, k: int) -> Tensor:
    """``C(top, k) / C(bottom, k)`` for ``0 <= top <= bottom`` and ``k <= bottom``, elementwise, in float64.

    Written as ``prod_{j < k} (top - j) / (bottom - j)`` so that no factorial is formed; a factor with
    ``top - j <= 0`` makes the product (and ``C(top, k)``) 0. ``k = 0`` gives 1.
    """
    j = torch.arange(k, dtype=torch.float64, device=top.device)
    factors = (top.unsqueeze(-1) - j).clamp(min=0) / (bottom.unsqueeze(-1) - j)
    return factors.prod(dim=-1)


@register_advantage_estimator("pass_at_k", compares_group_samples=True)
def pass_at_k(data: Mapping[str, Tensor], *, k: int, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """Pass@k training with the analytical advantage (Chen et al., "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation of Large Reasoning Models", arXiv:2508.10751).

    Reads ``response_mask``, ``group_ids`` and binary outcome scores (``scores``, or the masked sum
    of ``token_level_rewards``; each must be 0 or 1).

    The reward of a set of ``k`` samples is its pass@k, 1 if any of them is correct. For a (finest)
    group of ``N`` samples of which ``N_neg`` are wrong, the mean of that reward over all
    ``C(N, k)`` subsets and its std are::

        R = 1 - C(N_neg, k) / C(N, k)        sigma = sqrt(R (1 - R))

    and the advantage of a sample is its expected subset reward minus ``R``, over ``sigma``::

        A_pos = (1 - R) / (sigma + eps)
        A_neg = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / (sigma + eps)

    (a correct sample makes every subset containing it pass; a wrong one fails in the subsets whose
    other ``k - 1`` members are all wrong). Groups whose samples are all correct or all wrong get 0.
    With ``k = 1`` this is GRPO with the population (not Bessel-corrected) std. ``A`` is copied to
    every valid token; ``returns`` equals ``advantages``.

    Args:
        k: subset size of pass@k, ``1 <= k <=`` the size of every group.
        eps: added to ``sigma``.

    Returns:
        ``(advantages, returns)``, each ``[batch, response_len]``, 0 at invalid tokens.
    """
    who = "pass_at_k"
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"{who}: k must be an integer >= 1, got {k!r}")
    mask = _response_mask(data, who)
    scores = _sequence_scores(data, mask, who)
    correct = _binary_scores(scores, who)
    index, num_groups = group_index(_require(data, "group_ids", who).to(scores.device))
    if index.shape[0] != scores.shape[0]:
        raise ValueError(f"{who}: group_ids has {index.shape[0]} rows but the batch has {scores.shape[0]}")
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=scores.device)
    size = zeros.index_add(0, index, torch.ones_like(zeros[index]))
    wrong = zeros.index_add(0, index, (~correct).to(torch.float64))
    too_small = size < k
    if bool(too_small.any()):
        group = int(too_small.nonzero()[0, 0])
        row = int((index == group).nonzero()[0, 0])
        raise ValueError(
            f"{who}: k={k} exceeds the size {int(size[group])} of the group of row {row}; "
            "every group needs at least k samples"
        )
    mean = 1.0 - _ratio_of_binomials(wrong, size, k)
    sigma = torch.sqrt(mean * (1.0 - mean))
    all_fail_with_one_wrong = _ratio_of_binomials(wrong - 1, size - 1, k - 1)
    adv_correct = (1.0 - mean) / (sigma + eps)
    adv_wrong = (1.0 - mean - all_fail_with_one_wrong) / (sigma + eps)
    adv = torch.where(correct, adv_correct[index], adv_wrong[index]).to(scores.dtype)
    advantages = _per_token(adv, mask)
    return advantages, advantages.clone()


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
