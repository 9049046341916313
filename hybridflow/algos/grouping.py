"""Group statistics for group-relative advantage estimators (GRPO, RLOO, REINFORCE++-baseline).

Group ids come as an integer tensor, either ``[batch]`` (one level: the prompt each sample answers)
or ``[batch, levels]`` (hierarchical, e.g. ``[:, 0]`` = query id and ``[:, 1]`` = id of a shared
prefix within that query, as in tree-structured or multi-turn rollouts).

Two-level convention: a baseline is always computed within the FINEST group, i.e. among samples whose
whole id row is equal (same query AND same prefix). Prefix ids therefore only need to be unique within
their query: ``(0, 0)`` and ``(1, 0)`` are different groups. To baseline at the query level instead,
pass ``group_ids[:, 0]``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["GroupStats", "group_index", "group_stats"]


class GroupStats(NamedTuple):
    """Per-sample view of the statistics of the sample's group; every field is ``[batch]``."""

    count: Tensor
    """number of samples in the group"""
    mean: Tensor
    """mean score of the group"""
    std: Tensor
    """Bessel-corrected standard deviation of the group's scores; 0 for groups of size 1"""
    sum: Tensor
    """sum of the group's scores"""


def group_index(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map group ids to dense indices.

    Args:
        group_ids: integer tensor ``[batch]`` or ``[batch, levels]``.

    Returns:
        ``(index, num_groups)``: ``index[i]`` in ``[0, num_groups)`` is the same for two samples
        exactly when their id rows are equal (the finest group).
    """
    if not isinstance(group_ids, Tensor):
        raise TypeError(f"group_ids must be an integer tensor, got {type(group_ids).__name__}")
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise TypeError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    if group_ids.dim() == 1:
        keys = group_ids.unsqueeze(-1)
    elif group_ids.dim() == 2:
        keys = group_ids
    else:
        raise ValueError(f"group_ids must be [batch] or [batch, levels], got shape {tuple(group_ids.shape)}")
    unique, index = torch.unique(keys, dim=0, return_inverse=True)
    return index, int(unique.shape[0])


def group_stats(scores: Tensor, group_ids: Tensor) -> GroupStats:
    """Statistics of ``scores`` within each finest group, gathered back to every sample.

    Args:
        scores: ``[batch]`` sequence scores (e.g. rewards; any unit).
        group_ids: ``[batch]`` or ``[batch, levels]`` integer ids (see module docstring).

    Returns:
        :class:`GroupStats` with ``[batch]`` fields. Groups may have different sizes.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [batch], got shape {tuple(scores.shape)}")
    index, num_groups = group_index(group_ids.to(scores.device))
    if index.shape[0] != scores.shape[0]:
        raise ValueError(f"group_ids has {index.shape[0]} rows but scores has {scores.shape[0]} entries")
    # Accumulate in float64: small groups of nearly equal rewards make mean/std cancellation-prone.
    s = scores.to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=s.device)
    count = zeros.index_add(0, index, torch.ones_like(s))
    total = zeros.index_add(0, index, s)
    mean = total / count
    sq_dev = zeros.index_add(0, index, (s - mean[index]) ** 2)
    var = torch.where(count > 1, sq_dev / (count - 1).clamp(min=1), torch.zeros_like(sq_dev))
    out_dtype = scores.dtype
    return GroupStats(
        count=count[index].to(out_dtype),
        mean=mean[index].to(out_dtype),
        std=var.sqrt()[index].to(out_dtype),
        sum=total[index].to(out_dtype),
    )
