"""Row order for the actor update, on the controller: which rows carry advantage, and how to deal them
over the data-parallel ranks so that no rank waits for another.

Pure functions of a Batch's columns (``advantages``, ``response_mask``, ``input_ids``,
``attention_mask``); the controller's `trainer.steps.update_actor` and the workers' zero-advantage skip
share them.
"""

from __future__ import annotations

import torch

from hybridflow.contract import loss_response_mask
from hybridflow.protocol import Batch

__all__ = ["balanced_update_order", "carries_advantage"]


def carries_advantage(batch: Batch) -> torch.Tensor:
    """``[batch]`` bool: the rows whose ``advantages`` are non-zero at some response token of non-zero
    loss weight (`loss_response_mask`: ``response_mask``, times ``loss_mask`` when the batch has one).

    The other rows (zero advantage everywhere, or no counted token) give a policy loss of the form
    ``-A * f`` exactly zero value and gradient.
    """
    return ((batch["advantages"] != 0) & loss_response_mask(batch).bool()).any(dim=-1)


def _prompt_runs(batch: Batch, rows: list[int]) -> list[list[int]]:
    """``rows`` (ascending) cut into runs of consecutive rows with the same prompt tokens."""
    prompts = batch["input_ids"].masked_fill(~batch["attention_mask"].bool(), -1).cpu()
    runs: list[list[int]] = []
    for row in rows:
        if runs and runs[-1][-1] == row - 1 and torch.equal(prompts[row], prompts[row - 1]):
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs


def balanced_update_order(batch: Batch, world_size: int, mini_batch_size: int) -> torch.Tensor:
    """``[batch]`` row order for `update_actor` that spreads the rows carrying advantage evenly over
    the data-parallel ranks, by the tokens their forward computes; runs on the controller.

    `update_actor` gives rank ``r`` the ``r``-th contiguous share of the rows, takes each rank's part of
    a mini-batch from consecutive local rows, and leaves zero-advantage rows out of the forward, so a
    step waits for the rank with the most kept tokens. Within each mini-batch (the same rows, so the
    same update up to float rounding), consecutive rows with the same prompt (the samples of one prompt)
    are dealt as one unit, so that they meet in one micro-batch and share the prompt's forward
    (`hybridflow.parallel.shared_prefix`); a unit costs its prompt once plus its responses. The units
    carrying advantage are dealt largest first to the rank with the fewest such tokens that has room;
    the other units then fill the free slots, largest first to the rank with the fewest tokens in all.
    A unit that fits no rank's free slots is dealt row by row. Use as ``batch.reorder(order)``. A batch
    that does not split evenly over the ranks keeps its order (`update_actor` refuses it, naming the sizes).
    """
    rows = len(batch)
    if rows % world_size:
        return torch.arange(rows)
    local = rows // world_size
    local_mini = max(1, min(local, mini_batch_size // world_size))
    prompt_tokens = batch["attention_mask"].sum(dim=1).cpu().tolist()
    response_tokens = batch["response_mask"].sum(dim=1).cpu().tolist()
    keep = carries_advantage(batch).cpu().tolist()
    order = torch.empty(rows, dtype=torch.long)
    for start in range(0, local, local_mini):
        size = min(local_mini, local - start)
        members = [r * local + start + j for r in range(world_size) for j in range(size)]
        units = [
            unit
            for run in _prompt_runs(batch, members)
            for carrying in (True, False)
            if (unit := [row for row in run if keep[row] == carrying])
        ]
        dealt: list[list[int]] = [[] for _ in range(world_size)]
        kept_load, total_load = [0] * world_size, [0] * world_size

        def cost(unit: list[int]) -> int:
            return prompt_tokens[unit[0]] + sum(response_tokens[row] for row in unit)

        for carrying, load in ((True, kept_load), (False, total_load)):
            split: list[list[int]] = []
            for pass_units in ([u for u in units if keep[u[0]] == carrying], split):
                for unit in sorted(pass_units, key=cost, reverse=True):
                    room = [r for r in range(world_size) if size - len(dealt[r]) >= len(unit)]
                    if not room:  # only whole units get here: single rows always find a slot
                        split += [[row] for row in unit]
                        continue
                    rank = min(room, key=lambda r: load[r])
                    dealt[rank] += unit
                    kept_load[rank] += cost(unit) if carrying else 0
                    total_load[rank] += cost(unit)
        for rank, chosen in enumerate(dealt):
            order[rank * local + start : rank * local + start + size] = torch.tensor(chosen)
    return order
