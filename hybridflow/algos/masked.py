"""Statistics over the valid entries of a tensor, and the weighted sum the loss aggregations use.

``mask`` is broadcastable to the data; an entry is valid where it is non-zero. The statistics
(`masked_sum`, `masked_mean`, `masked_var`, `masked_whiten`, ...) count every valid entry once,
whatever its value, so a per-token loss weight never changes them; only `weighted_sum` multiplies
by the mask's values. Entries where the mask is 0 (padding, prompt tokens, tool output in multi-turn
rollouts) never affect a result, even when they hold inf or nan.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "LOG_RATIO_CLAMP",
    "last_valid_token_mask",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "top_fraction_mask",
    "weighted_sum",
]

# Log-ratios of two policies beyond +-20 nats (ratio ~5e8) only appear with stale or broken
# log-probs; clamping them keeps exp() finite in bf16/fp32 without changing any sane value.
LOG_RATIO_CLAMP = 20.0


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` over ``dim`` (all dims when ``None``), over the entries where ``mask`` is
    non-zero (the mask's values are not multiplied in: see `weighted_sum`).

    Uses ``torch.where`` rather than a product so that inf/nan in padded positions cannot leak.
    """
    valid = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return valid.sum() if dim is None else valid.sum(dim)


def weighted_sum(values: Tensor, weights: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values * weights`` over ``dim`` (all dims when ``None``), over the entries where
    ``weights`` is non-zero.

    ``weights`` is broadcastable to ``values`` (a 0/1 mask, or per-token loss weights >= 0). The
    product is taken under ``torch.where``, so inf/nan in entries of weight 0 cannot leak, into the
    value or the gradient. With a 0/1 ``weights`` it is bit for bit `masked_sum`: ``x * 1 == x``.
    """
    product = values * weights.to(values.dtype)
    kept = torch.where(weights != 0, product, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` over the entries where ``mask`` is non-zero; 0 where there are none.

    Formula: ``sum_{m != 0} values / max(#{m != 0}, 1)``.
    """
    count = masked_sum(torch.ones_like(values), mask, dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of ``values`` over all valid entries (a scalar).

    Formula: ``sum_{m != 0} (values - mu)^2 / (n - 1)`` with ``n = #{m != 0}`` when ``unbiased``
    (Bessel's correction, like ``torch.var``), else divided by ``n``. Returns 0 for ``n <= 1``.
    """
    mean = masked_mean(values, mask)
    count = masked_sum(torch.ones_like(values), mask)
    sq = masked_sum((values - mean) ** 2, mask)
    denom = count - 1 if unbiased else count
    return torch.where(denom > 0, sq / denom.clamp(min=1), torch.zeros_like(sq))


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """Normalise ``values`` to zero mean and unit variance over the valid entries.

    Formula: ``(values - mu) / sqrt(var + eps)`` with ``mu`` and the Bessel-corrected ``var`` taken
    over entries where ``mask != 0`` (:func:`masked_var`); with ``shift_mean=False`` the mean is
    added back (scale only). Invalid entries of the result are 0.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def last_valid_token_mask(response_mask: Tensor) -> Tensor:
    """One-hot ``[batch, response_len]`` marking each row's last position where ``response_mask`` is 1.

    Rows without any valid token get an all-zero row. This is where an outcome (sequence-level)
    score is placed when it is turned into a token-level reward.
    """
    mask = response_mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    # The largest valid position is unique per row, so argmax finds exactly it.
    last = torch.where(mask, positions, torch.full_like(positions, -1)).argmax(dim=-1)
    one_hot = torch.nn.functional.one_hot(last, num_classes=mask.shape[-1]).bool()
    return one_hot & mask.any(dim=-1, keepdim=True)


def top_fraction_mask(values: Tensor, mask: Tensor, fraction: float) -> Tensor:
    """``[*values.shape]`` bool: the valid entries whose value is among the top ``fraction`` of all valid
    entries (e.g. the 20% highest-entropy response tokens of a batch, arXiv 2506.01939).

    The threshold is the ``ceil(fraction * n)``-th largest of the ``n`` valid values, found with
    ``torch.kthvalue``, which has no size limit (``torch.quantile`` refuses more than 2**24 elements);
    every valid entry at or above it is kept, so ties at the threshold can keep slightly more than the
    fraction. ``fraction`` 0 keeps nothing, 1 keeps every valid entry.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must lie in [0, 1], got {fraction}")
    valid = mask.bool().expand_as(values)
    chosen = values[valid]
    keep = math.ceil(fraction * chosen.numel())
    if keep == 0:
        return torch.zeros_like(valid)
    threshold = torch.kthvalue(chosen.float(), chosen.numel() - keep + 1).values
    return valid & (values.float() >= threshold)
