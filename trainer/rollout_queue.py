"""Generation ahead of the trainer: the prompt stream with its look-ahead, and the batches in flight.

With ``async_rollout.max_staleness = k > 0`` (the rollout on a pool of its own), the rollout pool
generates up to ``k`` prompt batches ahead of the trainer's step: while the actor trains on batch
``t``, the engines already sample batch ``t + 1`` (and on, up to ``t + k``) with the newest weights
they were pushed. `trainer.steps.generate` drives it; this module holds the state:

- `PromptStream`: the run's prompt batches in data order. ``next`` hands the step its batch (as
  before); ``peek`` lets the queue take the batches of later steps early, without consuming them, so
  the batches trained stay exactly those of the synchronous run, in the same order. Its `state_dict`
  is the data position before the first batch taken early: a checkpoint written while batches are in
  flight resumes with them, so none is lost or trained twice.
- `RolloutQueue`: the batches admitted to the pool and not yet collected, oldest first, each with the
  step whose sampling seed it used and the Ray futures of its generation.

Admission is the bound: after collecting a step's batch, the queue holds at most ``k`` batches, each
generated with a version no older than the trainer's version when it was admitted. Nothing is ever
dropped, so long samples are trained exactly as often as short ones.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.controller import GroupFuture
from hybridflow.data import PromptLoader
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams

__all__ = ["InFlight", "PromptStream", "RolloutQueue", "StalenessError", "staleness_metrics"]


class StalenessError(RuntimeError):
    """Rows older than ``async_rollout.max_staleness`` versions reached the trainer."""


class PromptStream:
    """The prompt batches of ``loader``, epoch after epoch, with a look-ahead that does not consume them.

    Args:
        loader: the run's prompt loader (its position is the data position of checkpoints).
    """

    def __init__(self, loader: PromptLoader) -> None:
        self.loader = loader
        self._batches = self._endless()
        # Batches taken from the loader ahead of `next`, each with the loader's position before it.
        self._ahead: deque[tuple[Batch, dict[str, Any]]] = deque()

    def _endless(self) -> Iterator[Batch]:
        while True:
            yield from self.loader

    def _pull(self) -> tuple[Batch, dict[str, Any]]:
        state = dict(self.loader.state_dict())
        return next(self._batches), state

    def next(self) -> Batch:
        """The next batch in data order (a batch seen through `peek` first is that same object)."""
        return (self._ahead.popleft() if self._ahead else self._pull())[0]

    def peek(self, index: int) -> Batch:
        """The batch that the ``index``-th next call of `next` (0: the very next) will return."""
        while len(self._ahead) <= index:
            self._ahead.append(self._pull())
        return self._ahead[index][0]

    def state_dict(self) -> dict[str, Any]:
        """The data position of the next batch `next` returns: batches taken only through `peek` are
        not counted, so a resume hands them out again."""
        return dict(self._ahead[0][1]) if self._ahead else dict(self.loader.state_dict())


@dataclass
class InFlight:
    """A prompt batch admitted to the rollout pool.

    Attributes:
        prompts: the batch, as the prompt stream handed it out.
        step: the step whose sampling it used (the seed follows the step).
        sampling: the sampling it was started with.
        future: the pool's pending ``generate_sequences`` call.
    """

    prompts: Batch
    step: int
    sampling: SamplingParams
    future: GroupFuture


class RolloutQueue:
    """The batches in flight on the rollout pool, oldest first, at most ``max_staleness`` ahead of the
    trainer's step once the step's own batch is collected."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        self._in_flight: deque[InFlight] = deque()

    def __len__(self) -> int:
        return len(self._in_flight)

    def admit(self, entry: InFlight) -> None:
        """Add a batch whose generation has started."""
        self._in_flight.append(entry)

    def take(self, prompts: Batch, sampling: SamplingParams | None) -> tuple[Batch, float]:
        """The oldest batch's rollouts, which must be those of ``prompts`` (the same object the stream
        handed out) with ``sampling`` (None: whatever the batch was started with), and the seconds
        spent waiting for them.

        Raises:
            ValueError: the step asks for other prompts or another sampling than the pool was given
                (a step that builds its own prompt batches or sampling cannot run ahead).
        """
        head = self._in_flight[0]
        if head.prompts is not prompts:
            raise ValueError(
                "async_rollout.max_staleness > 0: generate takes the prompt batches in the order "
                "runtime.next_prompts hands them out, unchanged; this step passed a batch the rollout "
                f"pool was not given (the pool holds the batch of step {head.step} next)"
            )
        if sampling is not None and sampling != head.sampling:
            raise ValueError(
                "async_rollout.max_staleness > 0: generate samples ahead with the configured sampling of "
                f"each step; this step asked for {sampling}, the pool started step {head.step}'s batch "
                f"with {head.sampling}"
            )
        self._in_flight.popleft()
        started = time.perf_counter()
        rollouts = head.future.get()
        return rollouts, time.perf_counter() - started


def staleness_metrics(
    rollouts: Batch, trainer_version: int, max_staleness: int, previous: Mapping[str, float]
) -> dict[str, float]:
    """``async/*`` staleness of ``rollouts`` trained at ``trainer_version``, added to ``previous``
    (the step's metrics so far, for a step that generates more than once).

    Staleness is ``trainer_version - policy_version`` of each row, counted over its response tokens
    (``response_mask [rows, response_len]``, ``policy_version [rows]``). Returns
    ``async/tokens_staleness_{s}`` for every ``s`` in ``0..max_staleness`` (tokens),
    ``async/staleness_mean`` (token-weighted) and ``async/staleness_max`` (over rows with tokens).

    Raises:
        StalenessError: a row older than ``max_staleness`` versions (admission should never let one in).
    """
    tokens = rollouts["response_mask"].sum(-1).to(torch.int64)
    staleness = trainer_version - rollouts["policy_version"].to(torch.int64)
    if bool((staleness < 0).any()) or bool((staleness > max_staleness).any()):
        raise StalenessError(
            f"rows sampled with policy versions {sorted(set(rollouts['policy_version'].tolist()))} reached the "
            f"trainer at version {trainer_version}; async_rollout.max_staleness={max_staleness} allows "
            f"versions {trainer_version - max_staleness}..{trainer_version}"
        )
    counts = {
        f"async/tokens_staleness_{s}": previous.get(f"async/tokens_staleness_{s}", 0.0)
        + float(tokens[staleness == s].sum())
        for s in range(max_staleness + 1)
    }
    total = sum(counts.values())
    mean = sum(s * counts[f"async/tokens_staleness_{s}"] for s in range(max_staleness + 1)) / total if total else 0.0
    with_tokens = staleness[tokens > 0]
    latest_max = float(with_tokens.max()) if len(with_tokens) else 0.0
    return {
        **counts,
        "async/staleness_mean": mean,
        "async/staleness_max": max(latest_max, previous.get("async/staleness_max", 0.0)),
    }
