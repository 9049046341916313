"""Seeds for rollout calls: identical on the ranks of one TP group, distinct across dp ranks and calls."""

from __future__ import annotations

import numpy as np
import torch.distributed as dist

__all__ = ["SeedStream", "data_parallel_rank"]

# vLLM adds the sample index to a request's seed and keeps seeds in a signed 64-bit field; staying in
# 30 bits leaves room for rows * n additions without overflow.
_SEED_BITS = 30


def data_parallel_rank(tensor_parallel_size: int) -> int:
    """This process's data-parallel rank when consecutive groups of ``tensor_parallel_size`` ranks form
    one engine (0 without an initialised process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    world = dist.get_world_size()
    if world % tensor_parallel_size:
        raise ValueError(
            f"world size {world} does not divide by rollout.tensor_parallel_size {tensor_parallel_size}"
        )
    return dist.get_rank() // tensor_parallel_size


class SeedStream:
    """A deterministic sequence of per-call seeds derived from one base seed.

    Every rank of a TP group holds the same base seed and makes the same calls, so it draws the same
    seeds and samples the same tokens; a different base seed (another dp rank) gives other seeds.
    """

    def __init__(self, base_seed: int) -> None:
        self.base_seed = base_seed
        self._calls = 0

    def next(self, explicit: int | None = None) -> int:
        """The seed of the next call: ``explicit`` if given, else a fresh one from the stream."""
        self._calls += 1
        if explicit is not None:
            return explicit
        state = np.random.SeedSequence([self.base_seed, self._calls]).generate_state(1)[0]
        return int(state) & ((1 << _SEED_BITS) - 1)
