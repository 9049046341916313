"""Latent-GRPO's tensor functions (Deng et al., "Latent-GRPO: Group Relative Policy Optimization for Latent
Reasoning", arXiv 2604.27998): the one-sided Gumbel exploration of a latent step, the soft input embedding
it feeds back, the Gumbel log-density that stands for a latent step's log-prob in training, with its
straight-through flip (sign kept, magnitude bounded), the advantage with invalid-sample masking and
first-position selection, and group filtering.

A latent step is a point in the span of the token embeddings. At a latent position the model's next-token
log-probs ``logp`` (temperature 1) are perturbed, ``g = logp + s * (clamp(G, -1.5, 3) + 1.5)`` with ``G``
standard Gumbel and ``s`` the noise scale; the top ``K`` ids by ``g`` and their ``g`` are the step, and the
next input is ``sum_k softmax(g_topK / tau)_k E[id_k]``. Everything here is pure: tensors in, tensors out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "GUMBEL_CLAMP",
    "LatentSampling",
    "first_position_selection",
    "informative_groups",
    "latent_candidates",
    "latent_grpo_advantages",
    "latent_log_density",
    "mixture_weights",
    "one_sided_gumbel",
    "soft_embeddings",
]

GUMBEL_CLAMP = (-1.5, 3.0)
"""The range standard Gumbel noise is clamped to before the shift by ``-GUMBEL_CLAMP[0]`` (one-sided)."""


@dataclass(frozen=True)
class LatentSampling:
    """How a latent step is drawn.

    Attributes:
        top_k: candidates kept per latent step (``K``; the paper's 10).
        tau: temperature of the mixture weights ``softmax(g_topK / tau)``.
        noise_scale: ``s``, the scale of the one-sided Gumbel noise; 0 makes the latent phase
            deterministic (validation).
        end_of_thinking_id: the token whose coming out on top ends the latent phase.
    """

    top_k: int = 10
    tau: float = 1.0
    noise_scale: float = 1.0
    end_of_thinking_id: int = 0

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"recipe.top_k must be >= 1, got {self.top_k}")
        if not self.tau > 0:
            raise ValueError(f"recipe.tau must be > 0, got {self.tau}")
        if self.noise_scale < 0:
            raise ValueError(f"recipe.noise_scale must be >= 0, got {self.noise_scale}")


def one_sided_gumbel(shape: tuple[int, ...], scale: float, generator: torch.Generator) -> torch.Tensor:
    """``scale * (clamp(G, -1.5, 3) + 1.5)`` with ``G`` standard Gumbel: noise in ``[0, 4.5 * scale]``.

    Drawn on the CPU from ``generator`` (float32), so a seed reproduces it on any device.
    """
    uniform = torch.rand(shape, generator=generator).clamp(torch.finfo(torch.float32).tiny, 1.0 - 1e-7)
    gumbel = -torch.log(-torch.log(uniform))
    low, high = GUMBEL_CLAMP
    return scale * (gumbel.clamp(low, high) - low)


def latent_candidates(log_probs: torch.Tensor, noise: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``top_k`` ids of ``g = log_probs + noise`` and their ``g``, by decreasing ``g``.

    Args:
        log_probs: ``[rows, vocab]`` next-token log-probs at temperature 1 (nats).
        noise: ``[rows, vocab]``, e.g. `one_sided_gumbel`.

    Returns:
        ``ids [rows, top_k]`` (int64; column 0 is the top id) and ``g [rows, top_k]`` (float32).
    """
    g, ids = (log_probs.float() + noise.to(log_probs.device)).topk(top_k, dim=-1)
    return ids, g


def mixture_weights(g: torch.Tensor, tau: float) -> torch.Tensor:
    """``softmax(g / tau)`` over the last dim: the weights ``[..., K]`` of a latent step's candidates."""
    return torch.softmax(g.float() / tau, dim=-1)


def soft_embeddings(ids: torch.Tensor, g: torch.Tensor, tau: float, embedding: torch.Tensor) -> torch.Tensor:
    """The input a latent step feeds back: ``sum_k softmax(g / tau)_k * embedding[ids_k]``.

    Args:
        ids: ``[..., K]`` candidate ids; g: ``[..., K]`` their perturbed log-probs.
        embedding: ``[vocab, hidden]`` input embedding matrix.

    Returns:
        ``[..., hidden]`` in ``embedding``'s dtype.
    """
    weights = mixture_weights(g, tau).to(embedding.dtype)
    return (weights.unsqueeze(-1) * embedding[ids]).sum(dim=-2)


def _gumbel_term(gap: torch.Tensor) -> torch.Tensor:
    """``-d - exp(-d)``: the standard Gumbel log-density at ``d = g - logp`` (nats)."""
    return -gap - torch.exp(-gap)


def latent_log_density(
    candidate_log_probs: torch.Tensor, g: torch.Tensor, flip: torch.Tensor | None = None
) -> torch.Tensor:
    """A latent step's log-prob: the mean over its ``K`` candidates of the Gumbel(loc = logp_k, scale 1)
    log-density at ``g_k``, ``(1/K) sum_k [-(g_k - logp_k) - exp(-(g_k - logp_k))]`` (nats).

    Args:
        candidate_log_probs: ``[..., K]`` the policy's log-probs ``logp_k`` of the stored ids (with
            gradient in training).
        g: ``[..., K]`` the stored perturbed values.
        flip: ``[...]`` bool, where the straight-through flip applies (advantage <= 0). There, for each
            candidate with ``d_k = g_k - logp_k < 0``, the value stays the density term at ``d_k`` and
            the gradient is that of the term at ``-d_k``: ``d/dlogp_k`` is ``exp(d_k) - 1`` in place of
            ``1 - exp(-d_k)``, the same sign (negative) and a magnitude below 1 in place of one that
            grows as ``exp(-d_k)`` (the official Latent-GRPO code's rule). ``d_k < 0`` happens only
            once the policy has moved past the stored noise (a later optimizer step on the same batch):
            the sampled noise is one-sided, so ``d_k >= 0`` under the sampling policy.

    Returns:
        ``[...]`` log-densities.
    """
    gap = g.float() - candidate_log_probs.float()
    value = _gumbel_term(gap)
    if flip is None:
        return value.mean(dim=-1)
    flipped = flip.unsqueeze(-1) & (gap.detach() < 0)
    proxy = torch.where(flipped, _gumbel_term(-gap), value)
    # proxy - proxy.detach() is exactly 0: the value is the term at d, the gradient the proxy's.
    return (value.detach() + (proxy - proxy.detach())).mean(dim=-1)


def first_position_selection(
    advantages: torch.Tensor, response_mask: torch.Tensor, group_ids: torch.Tensor, old_log_probs: torch.Tensor
) -> torch.Tensor:
    """Optimal correct-path first-token selection: in every group that has a row with a positive
    advantage at its first response position, only the one such row with the highest length-normalised
    old log-prob (mean over its response tokens) keeps its first-position advantage; every other row of
    the group gets 0 there. Groups without a positive row are left as they are.

    All inputs are ``[batch, response_len]`` except ``group_ids [batch]``; returns a new advantages tensor.
    """
    out = advantages.clone()
    mask = response_mask.bool()
    has_token = mask.any(dim=-1)
    start = mask.int().argmax(dim=-1)
    rows = torch.arange(len(out))
    first = out[rows, start]
    mean_log_prob = (old_log_probs * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    for group in group_ids.unique():
        members = (group_ids == group) & has_token
        positive = members & (first > 0)
        if not positive.any():
            continue
        winner = torch.where(positive, mean_log_prob, torch.tensor(float("-inf"))).argmax()
        losers = members.clone()
        losers[winner] = False
        out[rows[losers], start[losers]] = 0.0
    return out


def latent_grpo_advantages(
    scores: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: torch.Tensor,
    truncated: torch.Tensor,
    old_log_probs: torch.Tensor,
    select_first: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Latent-GRPO's advantage ``[batch, response_len]``.

    1. Group z-score of ``scores [batch]``: ``(r - mean) / (std + eps)`` with the mean and the (Bessel)
       std taken over the group's rows that are not ``truncated [batch]`` (bool); a group with fewer than
       two such rows uses mean 0 and std 1.
    2. Invalid-sample masking: truncated rows get advantage 0 everywhere.
    3. The row advantage is spread over its valid response tokens (``response_mask``), and, with
       ``select_first``, `first_position_selection` keeps one positive row's advantage at the first
       position per group.
    """
    valid = ~truncated.bool()
    advantage = torch.zeros_like(scores, dtype=torch.float32)
    for group in group_ids.unique():
        members = group_ids == group
        counted = scores[members & valid].float()
        mean, std = (counted.mean(), counted.std()) if len(counted) >= 2 else (0.0, 1.0)
        advantage[members] = (scores[members].float() - mean) / (std + eps)
    advantage = torch.where(valid, advantage, 0.0)
    per_token = advantage.unsqueeze(-1) * response_mask.float()
    if not select_first:
        return per_token
    return first_position_selection(per_token, response_mask, group_ids, old_log_probs)


def informative_groups(scores: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Group filtering: ``[batch]`` bool, True on the rows of groups whose ``scores [batch]`` are not all
    equal (a group of equal scores has advantage 0 on every row and teaches nothing)."""
    keep = torch.zeros(len(scores), dtype=torch.bool)
    for group in group_ids.unique():
        members = group_ids == group
        keep[members] = bool(scores[members].max() > scores[members].min())
    return keep
