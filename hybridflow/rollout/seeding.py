"""Seeds for rollout calls: identical on the ranks of one TP group, distinct across dp ranks and calls.

Each engine holds a `SeedStream` whose base seed identifies its data-parallel group: the engines
build it from ``rollout.seed + dp_rank``, the same on the ``rollout.tp_size`` ranks of one
engine and different across engines. A call's seed is always derived from that base:

* ``SamplingParams.seed=None``: the next seed of the stream (a fresh one per call);
* an explicit ``SamplingParams.seed``: ``data_parallel_seed(seed, base_seed)``, a hash of both. The
  same explicit seed then reproduces each engine's own samples, while the dp engines, which sample
  different prompts from the same weights, draw independent random streams instead of one shared
  stream (with one seed everywhere, rank d's i-th request would see the same random numbers as every
  other rank's i-th request).
"""

from __future__ import annotations

import numpy as np
import torch.distributed as dist

__all__ = ["SeedStream", "data_parallel_rank", "data_parallel_seed"]

# vLLM adds the sample index to a request's seed and keeps seeds in a signed 64-bit field; staying in
# 30 bits leaves room for rows * n additions without overflow.
_SEED_BITS = 30
# Keeps the seeds derived from explicit seeds apart from the stream's own (another hash domain).
_EXPLICIT_DOMAIN = 1


def _to_seed(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1)[0]) & ((1 << _SEED_BITS) - 1)


def data_parallel_rank(tensor_parallel_size: int) -> int:
    """This process's data-parallel rank when consecutive groups of ``tensor_parallel_size`` ranks form
    one engine (0 without an initialised process group)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0
    world = dist.get_world_size()
    if world % tensor_parallel_size:
        raise ValueError(
            f"world size {world} does not divide by rollout.tp_size {tensor_parallel_size}"
        )
    return dist.get_rank() // tensor_parallel_size


def data_parallel_seed(seed: int, engine_key: int) -> int:
    """The seed an engine samples with when a call asks for ``seed``.

    Args:
        seed: the call's explicit seed (``SamplingParams.seed``).
        engine_key: what tells this engine from the other data-parallel engines and is equal on the
            TP ranks of one engine: the dp rank, or (as `SeedStream` passes it) the engine's base
            seed ``rollout.seed + dp_rank``.

    Returns:
        a deterministic hash of ``(seed, engine_key)`` in ``[0, 2**30)``: the same inputs give the same
        seed in every process and run; other keys give other (independent-looking) seeds.
    """
    return _to_seed(np.random.SeedSequence([seed, engine_key], spawn_key=(_EXPLICIT_DOMAIN,)))


class SeedStream:
    """A deterministic sequence of per-call seeds derived from one base seed.

    Every rank of a TP group holds the same base seed and makes the same calls, so it draws the same
    seeds and samples the same tokens; a different base seed (another dp rank) gives other seeds,
    also for a call that passes an explicit seed.
    """

    def __init__(self, base_seed: int) -> None:
        self.base_seed = base_seed
        self._calls = 0

    def next(self, explicit: int | None = None) -> int:
        """The seed of the next call: with ``explicit``, ``data_parallel_seed(explicit, base_seed)``
        (the same for the same explicit seed, whatever the calls before); otherwise a fresh one from
        the stream."""
        self._calls += 1
        if explicit is not None:
            return data_parallel_seed(explicit, self.base_seed)
        return _to_seed(np.random.SeedSequence([self.base_seed, self._calls]))
