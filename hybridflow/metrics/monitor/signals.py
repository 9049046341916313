"""Pure functions behind the training monitor's hacking signals and diagnostics.

Trends are measured over a window of per-step values with an ordinary least-squares line: its slope
times the window's span is the *change over the window*, which a single noisy step moves far less than
a difference of endpoints would.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from hybridflow.algos import group_index

__all__ = [
    "batch_repetition",
    "equal_reward_groups",
    "repeated_ngram_share",
    "standardized_change",
    "window_change",
]


def window_change(values: Sequence[float]) -> float:
    """Change over a window of per-step ``values [steps]``: least-squares slope times ``steps - 1``.

    Exact for a straight line (``[1, 2, 3, 4]`` gives 3). Needs at least two values.
    """
    if len(values) < 2:
        raise ValueError(f"window_change needs at least 2 values, got {len(values)}")
    y = torch.as_tensor(values, dtype=torch.float64)
    x = torch.arange(len(values), dtype=torch.float64)
    x = x - x.mean()
    slope = (x * (y - y.mean())).sum() / (x * x).sum()
    return float(slope * (len(values) - 1))


def standardized_change(means: Sequence[float], variances: Sequence[float]) -> float:
    """:func:`window_change` of per-step ``means`` in units of the window's pooled standard deviation.

    ``means[t]`` and ``variances[t]`` (population) describe step ``t``'s batch, all of one size. The
    pooled variance is ``mean(variances) + var(means)`` (law of total variance), so scores on different
    scales (a reward model's logits, a 0/1 rule) become comparable. A window without spread gives 0.
    """
    if len(means) != len(variances):
        raise ValueError(f"{len(means)} means but {len(variances)} variances")
    mean = torch.as_tensor(means, dtype=torch.float64)
    pooled = torch.as_tensor(variances, dtype=torch.float64).mean() + mean.var(correction=0)
    if pooled <= 0:
        return 0.0
    return window_change(means) / float(pooled.sqrt())


def repeated_ngram_share(tokens: Sequence[int], n: int) -> float | None:
    """Share of a response's ``n``-gram occurrences that repeat an earlier one in the same response.

    ``(occurrences - distinct) / occurrences``: 0 when every ``n``-gram is new, towards 1 for a loop
    (``[1, 2, 1, 2, 1, 2]`` with ``n=2``: 5 bigrams, 2 distinct, 0.6). ``None`` for fewer than ``n`` tokens.
    """
    if n < 1:
        raise ValueError(f"repeated_ngram_share needs n >= 1, got {n}")
    count = len(tokens) - n + 1
    if count < 1:
        return None
    distinct = len(set(zip(*(tokens[i : i + count] for i in range(n)), strict=True)))
    return (count - distinct) / count


def batch_repetition(responses: Tensor, response_mask: Tensor, n: int) -> float | None:
    """Mean :func:`repeated_ngram_share` over the responses of ``responses [batch, response_len]``.

    Each row's tokens are those where ``response_mask [batch, response_len]`` is 1; responses shorter
    than ``n`` tokens do not count. ``None`` when none counts.
    """
    shares = []
    for ids, mask in zip(responses, response_mask.bool(), strict=True):
        share = repeated_ngram_share(ids[mask].tolist(), n)
        if share is not None:
            shares.append(share)
    return sum(shares) / len(shares) if shares else None


def equal_reward_groups(scores: Tensor, group_ids: Tensor) -> tuple[int, int]:
    """``(equal, groups)``: among prompt groups of at least two samples, how many scored all alike.

    ``scores [batch]``; ``group_ids [batch]`` or ``[batch, levels]`` (finest level, as the estimators
    group). A group whose rewards are all equal gets zero group-relative advantage. Single-sample
    groups are left out: they carry no comparison (``rollout.n`` 1, as PPO with GAE runs).
    """
    index, num_groups = group_index(group_ids)
    scores = scores.double()
    empty = torch.zeros(num_groups, dtype=torch.float64)
    high = empty.scatter_reduce(0, index, scores, reduce="amax", include_self=False)
    low = empty.scatter_reduce(0, index, scores, reduce="amin", include_self=False)
    compared = torch.bincount(index, minlength=num_groups) >= 2
    return int((compared & (high == low)).sum()), int(compared.sum())
