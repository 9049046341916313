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

With partial rollouts (``async_rollout.partial_round_tokens > 0``; `trainer.steps.generate_partial`)
the queue's `PartialPool` holds the prompts started and not yet trained, with their samples in
progress, and the stream holds their dataset indices (`PromptStream.hold`). A checkpoint keeps both:
the stream lists the held prompts, the pool's `PartialPool.state_dict` (a file of its own in the
checkpoint folder, `PARTIAL_FILE`) every held group's samples so far; a resumed run puts the groups back
into the pool, holds them again and continues their samples where they paused, and starts from scratch
only the held prompts the pool file does not hold. With the rollout on a pool of its own, the pool also
holds the round left running while the trainer works (`PendingRound`): the samples it continues, the
next step's prompts it started (taken through `PromptStream.peek`) and the Ray futures of its calls. A
checkpoint settles that round: it waits for it and saves every group with the round's tokens added
(`PartialPool.settled`), and the stream counts the batch the round started as handed out and held
(`PromptStream.state_dict`'s ``started``), so a resumed run continues those samples too and generates
nothing twice.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from hybridflow.contract import TOKEN_VERSIONS
from hybridflow.controller import GroupFuture
from hybridflow.data import PromptLoader
from hybridflow.data.collate import PromptCollator
from hybridflow.protocol import Batch
from hybridflow.rollout.partial import PartialSample, RoundCall, start_samples, take_output
from hybridflow.rollout.sampling import SamplingParams

__all__ = [
    "OWED_KEY",
    "PARTIAL_FILE",
    "InFlight",
    "PartialGroup",
    "PartialPool",
    "PendingRound",
    "PromptStream",
    "RolloutQueue",
    "StalenessError",
    "staleness_metrics",
]

OWED_KEY = "owed_indices"
"""The key of `PromptStream.state_dict` that lists the prompts handed out and not yet trained."""

PARTIAL_FILE = "partial_rollouts.pt"
"""The file of a checkpoint folder that holds `PartialPool.state_dict` (partial rollouts only)."""


class StalenessError(RuntimeError):
    """Rows older than ``async_rollout.max_staleness`` versions reached the trainer."""


class PromptStream:
    """The prompt batches of ``loader``, epoch after epoch, with a look-ahead that does not consume them.

    With partial rollouts a prompt handed out can outlive its step (its samples pause and go on in later
    steps); the step `hold`s the prompts it starts and `release`s those it trains. A checkpoint lists
    the held prompts by dataset index (``index``) next to the loader's position. A resumed stream holds
    again those whose samples the checkpoint kept (`PartialPool.load_state_dict`) and hands the others
    out again first (`load_state_dict`), in batches of the loader's size topped up from the loader:
    none is lost, none is trained twice, and every step still starts ``batch_size`` prompts.

    Args:
        loader: the run's prompt loader (its position is the data position of checkpoints).
    """

    def __init__(self, loader: PromptLoader) -> None:
        self.loader = loader
        self._batches = self._endless()
        # Batches taken from the loader ahead of `next`, each with the loader's position before it.
        self._ahead: deque[tuple[Batch, dict[str, Any]]] = deque()
        # Dataset indices to hand out before the loader's next batch (a resumed run's held prompts,
        # then the rest of a batch that topped them up), and those handed out and not yet trained, with
        # their count: the next epoch can hand a prompt out again while its earlier start still runs.
        self._owed: deque[int] = deque()
        self._held: Counter[int] = Counter()

    def _endless(self) -> Iterator[Batch]:
        while True:
            yield from self.loader

    def _pull(self) -> tuple[Batch, dict[str, Any]]:
        state = dict(self.loader.state_dict())
        return next(self._batches), state

    def next(self) -> Batch:
        """The next batch in data order (a batch seen through `peek` first is that same object)."""
        if self._owed:
            return self._next_owed()
        return (self._ahead.popleft() if self._ahead else self._pull())[0]

    def _next_owed(self) -> Batch:
        """A batch of ``batch_size`` prompts: owed ones first, then the loader's next batches' rows."""
        size = self.loader.sampler.batch_size
        while len(self._owed) < size:
            self._owed.extend(int(i) for i in self._pull()[0]["index"])
        indices = [self._owed.popleft() for _ in range(size)]
        return self.loader.collate([self.loader.dataset[i] for i in indices])

    @property
    def owes(self) -> bool:
        """Whether a resumed run still owes held prompts (`next` hands them out before the loader's)."""
        return bool(self._owed)

    def peek(self, index: int) -> Batch:
        """The batch that the ``index``-th next call of `next` (0: the very next) will return."""
        if self._owed:
            raise RuntimeError("PromptStream.peek: a resumed run still owes held prompts (partial rollouts)")
        while len(self._ahead) <= index:
            self._ahead.append(self._pull())
        return self._ahead[index][0]

    def hold(self, prompts: Batch) -> None:
        """Count ``prompts`` (by their ``index`` column) as handed out and not yet trained (a prompt
        handed out again while held counts once more)."""
        self._held.update(int(i) for i in prompts["index"])

    def release(self, indices: list[int]) -> None:
        """The held prompts of ``indices`` were trained (each index once per start trained)."""
        for index in indices:
            if index not in self._held:
                raise KeyError(f"PromptStream.release: prompt {index} is not held")
            self._held[index] -= 1
            if not self._held[index]:
                del self._held[index]

    def state_dict(self, started: Batch | None = None) -> dict[str, Any]:
        """The data position of the next batch `next` returns: batches taken only through `peek` are
        not counted, so a resume hands them out again. Held and owed prompts, if any, are listed under
        `OWED_KEY` (dataset indices, held first, a prompt held twice listed twice), for the resumed
        stream to hand out first.

        Args:
            started: the look-ahead's first batch (``peek(0)``, the same object) when its samples were
                started and are saved with the checkpoint (the batch a round left running on the rollout
                pool started): it counts as handed out and held, so the position is after it and its
                prompts are listed last under `OWED_KEY`.
        """
        ahead = list(self._ahead)
        held = list(self._held.elements())
        if started is not None:
            if not ahead or ahead[0][0] is not started:
                raise ValueError("PromptStream.state_dict: started must be the look-ahead's first batch, peek(0)")
            ahead = ahead[1:]
            held += [int(i) for i in started["index"]]
        state = dict(ahead[0][1]) if ahead else dict(self.loader.state_dict())
        if held or self._owed:
            state[OWED_KEY] = [*held, *self._owed]
        return state

    def load_state_dict(self, state: dict[str, Any], kept: Sequence[int] = ()) -> None:
        """Resume from a `state_dict`: the loader's position, and the prompts owed from before.

        Args:
            state: a `state_dict`.
            kept: dataset indices of held prompts whose samples the checkpoint kept (the groups
                `PartialPool.load_state_dict` restored): they are held again, not owed, so they are not
                started a second time; the rest of `OWED_KEY` is owed, in its order.
        """
        self.loader.load_state_dict({key: value for key, value in state.items() if key != OWED_KEY})
        self._batches = self._endless()
        self._ahead.clear()
        self._held = Counter(int(i) for i in kept)
        unmatched = Counter(self._held)
        owed: deque[int] = deque()
        for index in (int(i) for i in state.get(OWED_KEY, ())):
            if unmatched[index]:
                unmatched[index] -= 1
            else:
                owed.append(index)
        if +unmatched:
            raise ValueError(
                f"PromptStream.load_state_dict: prompts {sorted(unmatched.elements())} are kept by the "
                f"partial-rollout pool but not listed under {OWED_KEY!r} of the checkpoint's data position"
            )
        self._owed = owed


@dataclass
class PartialGroup:
    """One prompt's samples under partial rollouts (``async_rollout.partial_round_tokens``).

    Attributes:
        prompt: the prompt's row (one row of the batch it was handed out in, every column).
        index: its dataset index.
        version: the policy version of the step that started it: its oldest tokens' version.
        samples: its ``rollout.n`` samples.
    """

    prompt: Batch
    index: int
    version: int
    samples: list[PartialSample]

    @property
    def complete(self) -> bool:
        """Whether every sample finished: the group can train."""
        return all(sample.finished for sample in self.samples)


@dataclass
class PendingRound:
    """A partial-rollout round submitted to the rollout pool and not yet collected.

    Attributes:
        calls: each engine call of the round (`hybridflow.rollout.partial.RoundCall`) with the pool's
            pending ``generate_sequences`` call for it.
        version: the policy version the pool serves for the round (its tokens' version).
        admitted: the prompt batch the round started, the stream's next (through `PromptStream.peek`),
            which the next step must be handed; None when the round only continues samples.
        cap: the samples' response cap (``max_new_tokens`` of the sampling they started with).
    """

    calls: list[tuple[RoundCall, GroupFuture]]
    version: int
    admitted: Batch | None
    cap: int
    _outputs: list[Batch] | None = field(default=None, repr=False)

    def outputs(self) -> list[Batch]:
        """Each call's output, in the order of ``calls``: the first call waits for the pool, later ones
        return the same Batches (a checkpoint and then the next step both read the round)."""
        if self._outputs is None:
            self._outputs = [future.get() for _, future in self.calls]
        return self._outputs


class PartialPool:
    """The prompt groups started and not yet trained, oldest first, the round left running on a
    rollout pool of its own (``pending``; None when colocated or when none runs), and the step that
    last generated (``generated_in_step``; 0: none yet), since a step generates once."""

    def __init__(self) -> None:
        self.groups: list[PartialGroup] = []
        self.pending: PendingRound | None = None
        self.generated_in_step = 0

    def __len__(self) -> int:
        return len(self.groups)

    def start(self, prompts: Batch, n: int, version: int) -> None:
        """Start ``n`` samples of every prompt of ``prompts`` (with an ``index`` column) at ``version``."""
        samples = start_samples(prompts, n)
        for row, index in enumerate(prompts["index"]):
            self.groups.append(PartialGroup(prompts[row], int(index), version, samples[row * n : (row + 1) * n]))

    def unfinished(self, version: int, max_staleness: int) -> tuple[list[PartialSample], list[PartialSample]]:
        """The unfinished samples: those that must finish in this step (their group started at
        ``version - max_staleness`` or earlier, so its oldest tokens train at the bound now), and the rest."""
        due: list[PartialSample] = []
        rest: list[PartialSample] = []
        for group in self.groups:
            live = [sample for sample in group.samples if not sample.finished]
            (due if group.version <= version - max_staleness else rest).extend(live)
        return due, rest

    def complete(self) -> int:
        """How many groups can train."""
        return sum(group.complete for group in self.groups)

    def take(self, count: int) -> list[PartialGroup]:
        """Remove and return the ``count`` oldest complete groups."""
        taken = [group for group in self.groups if group.complete][:count]
        chosen = {id(group) for group in taken}
        self.groups = [group for group in self.groups if id(group) not in chosen]
        return taken

    def settled(self) -> list[PartialGroup]:
        """The groups as they will be once the round left running (``pending``) is collected: copies of
        the samples with that round's tokens added (this waits for the round), the pool itself
        unchanged. Without a pending round, the groups themselves."""
        if self.pending is None:
            return list(self.groups)
        copies = {
            id(sample): replace(
                sample, token_ids=list(sample.token_ids), log_probs=list(sample.log_probs), versions=list(sample.versions)
            )
            for group in self.groups
            for sample in group.samples
        }
        for (call, _), out in zip(self.pending.calls, self.pending.outputs(), strict=True):
            samples = [copies[id(sample)] for sample in call.samples]
            take_output(samples, out, self.pending.version, self.pending.cap)
        return [
            PartialGroup(group.prompt, group.index, group.version, [copies[id(s)] for s in group.samples])
            for group in self.groups
        ]

    def state_dict(self) -> dict[str, Any]:
        """Every group (`settled`: with the tokens of the round left running, if any, which this waits
        for), oldest first, as plain data for a checkpoint: each group's dataset ``index``, ``version``,
        prompt ``width`` (the left-padded width of the batch it was handed out in) and ``samples``, each
        with ``group`` (its row in that batch), ``token_ids`` (int64 ``[tokens so far]``), ``log_probs``
        (float64 ``[tokens so far]``, nats), ``versions`` (int64 ``[tokens so far]``),
        ``finish_reason`` and ``rounds``. The prompts of a round's ``admitted`` batch are among them:
        the stream's state must count that batch as handed out (`PromptStream.state_dict`'s ``started``)."""
        return {
            "groups": [
                {
                    "index": group.index,
                    "version": group.version,
                    "width": int(group.prompt["input_ids"].shape[1]),
                    "samples": [
                        {
                            "group": sample.group,
                            "token_ids": torch.tensor(sample.token_ids, dtype=torch.int64),
                            "log_probs": torch.tensor(sample.log_probs, dtype=torch.float64),
                            "versions": torch.tensor(sample.versions, dtype=torch.int64),
                            "finish_reason": sample.finish_reason,
                            "rounds": sample.rounds,
                        }
                        for sample in group.samples
                    ],
                }
                for group in self.settled()
            ]
        }

    def load_state_dict(
        self, state: Mapping[str, Any], dataset: Sequence[Mapping[str, Any]], pad_token_id: int
    ) -> None:
        """Put back the groups of a `state_dict`, replacing the pool's, with no round pending. Each
        prompt row is rebuilt from ``dataset[index]`` (a `hybridflow.data.PromptDataset`), left-padded with
        ``pad_token_id`` to its saved width, so it is the row the group was started with."""
        self.pending = None
        self.groups = []
        for saved in state["groups"]:
            prompt = PromptCollator(pad_token_id, pad_to=saved["width"])([dataset[saved["index"]]])
            prompt_ids = tuple(prompt["input_ids"][0][prompt["attention_mask"][0].bool()].tolist())
            samples = [
                PartialSample(
                    group=sample["group"],
                    prompt_ids=prompt_ids,
                    token_ids=sample["token_ids"].tolist(),
                    log_probs=sample["log_probs"].tolist(),
                    versions=sample["versions"].tolist(),
                    finish_reason=sample["finish_reason"],
                    rounds=sample["rounds"],
                )
                for sample in saved["samples"]
            ]
            self.groups.append(PartialGroup(prompt, int(saved["index"]), int(saved["version"]), samples))


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
        # With partial rollouts: the prompt groups whose samples are still generating (and, on a rollout
        # pool of its own, the round left running).
        self.partial = PartialPool()

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

    Staleness is ``trainer_version - version`` of each response token (``response_mask [rows,
    response_len]``), its version read from ``token_versions [rows, response_len]`` when the batch has
    it (partial rollouts: a sample continued on newer weights holds tokens of several versions), else
    from its row's ``policy_version [rows]``. Returns ``async/tokens_staleness_{s}`` for every ``s`` in
    ``0..max_staleness`` (tokens), ``async/staleness_mean`` (token-weighted) and ``async/staleness_max``
    (over tokens).

    Raises:
        StalenessError: a token older than ``max_staleness`` versions (admission should never let one in).
    """
    mask = rollouts["response_mask"].bool()
    if TOKEN_VERSIONS in rollouts:
        versions = rollouts[TOKEN_VERSIONS].to(torch.int64)
    else:
        versions = rollouts["policy_version"].to(torch.int64)[:, None].expand(mask.shape)
    staleness = trainer_version - versions[mask]
    if bool((staleness < 0).any()) or bool((staleness > max_staleness).any()):
        raise StalenessError(
            f"tokens sampled with policy versions {sorted(set(versions[mask].tolist()))} reached the "
            f"trainer at version {trainer_version}; async_rollout.max_staleness={max_staleness} allows "
            f"versions {trainer_version - max_staleness}..{trainer_version}"
        )
    counts = {
        f"async/tokens_staleness_{s}": previous.get(f"async/tokens_staleness_{s}", 0.0)
        + float((staleness == s).sum())
        for s in range(max_staleness + 1)
    }
    total = sum(counts.values())
    mean = sum(s * counts[f"async/tokens_staleness_{s}"] for s in range(max_staleness + 1)) / total if total else 0.0
    latest_max = float(staleness.max()) if len(staleness) else 0.0
    return {
        **counts,
        "async/staleness_mean": mean,
        "async/staleness_max": max(latest_max, previous.get("async/staleness_max", 0.0)),
    }
