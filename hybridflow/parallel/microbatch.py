"""Dynamic micro-batching: split a batch's rows into micro-batches under a token budget.

With packing, the cost of a micro-batch is its number of valid tokens, not its number of rows, so rows
are grouped by tokens: a micro-batch may hold one long answer or twenty short ones.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridflow.parallel.device import process_group_device_plan


@dataclass(frozen=True)
class MicroBatchPlan:
    """Row indices of each micro-batch; concatenating them gives a permutation of ``range(batch)``."""

    micro_batches: list[list[int]]

    @property
    def restore(self) -> torch.Tensor:
        """``[batch]`` index that puts rows concatenated in micro-batch order back in batch order."""
        order = torch.tensor([i for mb in self.micro_batches for i in mb], dtype=torch.long)
        return torch.argsort(order)

    def restore_order(self, outputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """Concatenate per-micro-batch ``outputs`` (dim 0 = rows) and return them in batch order."""
        joined = torch.cat(list(outputs))
        return joined[self.restore.to(joined.device)]


def _fill(counts: list[int], num_bins: int, max_tokens: int) -> list[list[int]] | None:
    """Longest-first into the currently lightest bin; ``None`` if a row does not fit there."""
    bins: list[list[int]] = [[] for _ in range(num_bins)]
    heap = [(0, b) for b in range(num_bins)]
    for row in sorted(range(len(counts)), key=lambda r: -counts[r]):
        load, b = heapq.heappop(heap)
        # The lightest bin has the most room; if the row does not fit there it fits nowhere.
        if load + counts[row] > max_tokens:
            return None
        bins[b].append(row)
        heapq.heappush(heap, (load + counts[row], b))
    return bins


def plan_micro_batches(
    token_counts: Sequence[int] | torch.Tensor, max_tokens: int, *, min_micro_batches: int = 1
) -> MicroBatchPlan:
    """Split rows with ``token_counts [batch]`` valid tokens into balanced micro-batches.

    Uses the fewest micro-batches (at least ``min_micro_batches``) for which a greedy balanced partition
    keeps every micro-batch at or under ``max_tokens`` tokens. Rows within a micro-batch keep their
    batch order. Raises ``ValueError`` if one row alone exceeds the budget.
    """
    counts = [
        int(c) for c in (token_counts.tolist() if isinstance(token_counts, torch.Tensor) else token_counts)
    ]
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    if not counts:
        raise ValueError("cannot plan micro-batches for an empty batch")
    if min_micro_batches > len(counts):
        raise ValueError(f"min_micro_batches={min_micro_batches} exceeds the {len(counts)} rows")
    longest = max(counts)
    if longest > max_tokens:
        raise ValueError(
            f"a row has {longest} tokens, more than max_tokens_per_micro_batch={max_tokens}; raise the budget"
        )
    num_bins = max(min_micro_batches, math.ceil(sum(counts) / max_tokens))
    while (bins := _fill(counts, num_bins, max_tokens)) is None:
        num_bins += 1
    return MicroBatchPlan([sorted(b) for b in bins])


def agree_micro_batch_count(count: int, group: dist.ProcessGroup | None = None) -> int:
    """The largest ``count`` over ``group`` (a collective).

    FSDP2 all-gathers in every forward, so all ranks of the mesh must run the same number of
    micro-batches; each rank plans with ``min_micro_batches`` set to this value.
    """
    value = torch.tensor([count], dtype=torch.long, device=process_group_device_plan(group).device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return int(value.item())
