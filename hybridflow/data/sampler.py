"""A deterministic batch sampler whose position can be saved and restored mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["ResumableBatchSampler"]

# Fields of the state dict that must match between the saved run and the resumed one.
_SHAPE_FIELDS = ("num_rows", "batch_size", "seed", "shuffle", "drop_last")


class ResumableBatchSampler:
    """Yields lists of row indices, one list per batch, epoch after epoch.

    The order of epoch ``e`` depends only on ``(seed, e)``: a permutation drawn from
    ``numpy.random.default_rng([seed, e])`` (or ``0..num_rows-1`` without shuffling). ``position`` counts
    the batches of the current epoch already handed out, so ``(seed, epoch, position)`` fixes every
    batch still to come.

    Each ``iter()`` continues where the previous one stopped: it yields the remaining batches of the
    current epoch, then stops. Starting an ``iter()`` at the end of an epoch first moves to the next
    epoch, so ``(e, len(sampler))`` and ``(e + 1, 0)`` are the same state.

    Args:
        num_rows: dataset size.
        batch_size: rows per batch.
        seed: seed of the shuffling.
        shuffle: draw a new order each epoch; otherwise rows in order.
        drop_last: drop the last batch of an epoch when it has fewer than ``batch_size`` rows.
    """

    def __init__(
        self, num_rows: int, batch_size: int, seed: int = 0, shuffle: bool = True, drop_last: bool = True
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_rows < (batch_size if drop_last else 1):
            raise ValueError(
                f"{num_rows} rows cannot fill one batch of {batch_size} with drop_last={drop_last}"
            )
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0

    def __len__(self) -> int:
        """Batches per epoch."""
        full, rest = divmod(self.num_rows, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The row order of ``epoch``: int64 array ``[num_rows]``."""
        if not self.shuffle:
            return np.arange(self.num_rows, dtype=np.int64)
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)

    def __iter__(self) -> Iterator[list[int]]:
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
        order = self.epoch_order(self.epoch)
        while self.position < len(self):
            start = self.position * self.batch_size
            batch = order[start : start + self.batch_size].tolist()
            # Counted before the yield: a checkpoint taken while the consumer holds this batch
            # must not hand it out again on resume.
            self.position += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: the shape fields, ``epoch`` and ``position``."""
        return {
            **{key: getattr(self, key) for key in _SHAPE_FIELDS},
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state``; a ValueError names any field that differs from this sampler's."""
        missing = [key for key in (*_SHAPE_FIELDS, "epoch", "position") if key not in state]
        if missing:
            raise ValueError(f"sampler state lacks {missing}")
        different = {
            key: (state[key], getattr(self, key)) for key in _SHAPE_FIELDS if state[key] != getattr(self, key)
        }
        if different:
            raise ValueError(f"sampler state does not match this sampler (saved, current): {different}")
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
