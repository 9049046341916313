"""Partial rollouts: generation in budgeted rounds, where samples that have not finished pause and go
on in a later round, possibly on newer weights.

A round gives every unfinished sample at most ``budget`` new tokens. A sample that neither stopped nor
reached its cap (``SamplingParams.max_new_tokens``, the response length of the whole sample) pauses; in a
later round its prompt and the response so far are fed back as one prompt (exact ids, nothing
re-tokenised) and the engine continues it. Every token keeps the policy version of the weights that
sampled it, so a sample continued after a weight update carries ``[v1] * k + [v2] * ...``.

The round runs through any ``generate`` call with the contract of `RolloutEngine.generate`: an engine's
own method (tests, tools) or the actor group's ``generate_sequences`` (the trainer,
`trainer.steps.generate`). Each sample's budget in a round is ``min(budget, cap - generated so far)``;
a round makes one call per distinct budget, with ``max_new_tokens`` that budget, so that no prefix plus
its call's tokens passes the prompt length plus the cap (an engine's ``max_model_len``). With the cap a
multiple of the budget, every budgeted round is one call.

Greedy decoding makes a paused and continued sample token for token the sample one uninterrupted call
draws under the same weights; seeded sampling draws its random numbers per call, so a continuation
draws other (equally distributed) tokens than an uninterrupted call would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from hybridflow.protocol import Batch
from hybridflow.rollout.base import left_padded_prompts
from hybridflow.rollout.sampling import SamplingParams

__all__ = [
    "Generate",
    "PartialSample",
    "RoundCall",
    "RoundReport",
    "derived_seed",
    "prefix_batch",
    "response_columns",
    "round_calls",
    "run_round",
    "start_samples",
    "take_output",
]

Generate = Callable[[Batch, SamplingParams], Batch]
"""A generation call with the contract of `RolloutEngine.generate`."""


@dataclass
class PartialSample:
    """One sample, from its prompt through the rounds that generate it.

    Attributes:
        group: the prompt it answers (its row in the prompt Batch it started from).
        prompt_ids: the prompt's ids, unpadded.
        token_ids: the response so far, the final stop token included once it stopped.
        log_probs: the engine's log-prob (nats) of each response id under the weights that sampled it.
        versions: the policy version of the weights that sampled each response id.
        finish_reason: ``"stop"`` or ``"length"`` once finished; ``None`` while it has not started or
            is paused.
        rounds: the rounds that generated tokens of it (2 or more: it was paused and continued).
    """

    group: int
    prompt_ids: tuple[int, ...]
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    rounds: int = 0

    @property
    def finished(self) -> bool:
        """Whether the sample stopped or reached its cap."""
        return self.finish_reason is not None


@dataclass(frozen=True)
class RoundReport:
    """What one round did.

    Attributes:
        finished: the samples that finished in this round.
        paused: the samples that are still unfinished after it.
        resumed: samples continued from a paused response (not their first round).
        generated_tokens: response tokens kept from this round.
    """

    finished: list[PartialSample]
    paused: list[PartialSample]
    resumed: int
    generated_tokens: int


def derived_seed(seed: int, *keys: int) -> int:
    """A seed in ``[0, 2**31)`` hashed from ``seed`` and ``keys``: the calls of a step's rounds (round,
    budget) each draw their own random numbers, reproducibly, and apart from other steps' seeds."""
    return int(np.random.SeedSequence([seed, *keys]).generate_state(1)[0]) % 2**31


def start_samples(prompts: Batch, n: int) -> list[PartialSample]:
    """``n`` unstarted samples per row of ``prompts`` (``input_ids``/``attention_mask [rows, prompt_len]``,
    left-padded), prompt-major (row i's at ``i*n .. i*n+n-1``, their ``group`` i)."""
    samples = []
    for row, (ids, mask) in enumerate(zip(prompts["input_ids"], prompts["attention_mask"], strict=True)):
        prompt = tuple(ids[mask.bool()].tolist())
        samples.extend(PartialSample(group=row, prompt_ids=prompt) for _ in range(n))
    return samples


def prefix_batch(samples: Sequence[PartialSample], pad_token_id: int) -> Batch:
    """Each sample's prompt followed by its response so far, as left-padded ``input_ids`` and
    ``attention_mask [len(samples), longest prefix]``."""
    return left_padded_prompts([(*sample.prompt_ids, *sample.token_ids) for sample in samples], pad_token_id)


@dataclass(frozen=True)
class RoundCall:
    """One engine call of a round: the samples of one budget, fed back as prompts.

    Attributes:
        samples: the unfinished samples the call continues (or starts), one row each.
        prompts: their prefixes (`prefix_batch`), ``input_ids``/``attention_mask [len(samples), longest]``.
        sampling: the call's sampling: ``n`` 1, ``max_new_tokens`` the budget, its own seed.
        resumed: how many of ``samples`` continue a paused response (not their first round).
    """

    samples: list[PartialSample]
    prompts: Batch
    sampling: SamplingParams
    resumed: int


def round_calls(
    samples: Sequence[PartialSample], sampling: SamplingParams, budget: int | None, pad_token_id: int
) -> list[RoundCall]:
    """The engine calls of one round over the unfinished ``samples`` (see `run_round`), smallest budget
    first; none when every sample finished. A caller that must not wait (a round left running on a
    rollout pool while the trainer works) submits each call and later hands each output to `take_output`."""
    if budget is not None and budget < 1:
        raise ValueError(f"a round's budget must be >= 1 token, got {budget}")
    cap = sampling.max_new_tokens
    by_budget: dict[int, list[PartialSample]] = {}
    for sample in samples:
        if not sample.finished:
            room = cap - len(sample.token_ids)
            by_budget.setdefault(room if budget is None else min(budget, room), []).append(sample)
    calls = []
    for own_budget, group in sorted(by_budget.items()):
        # Calls of one round differ in seed: requests at the same position of two calls would share one.
        seed = None if sampling.seed is None else derived_seed(sampling.seed, own_budget)
        call = dataclasses.replace(sampling, n=1, max_new_tokens=own_budget, seed=seed)
        resumed = sum(1 for sample in group if sample.token_ids)
        calls.append(RoundCall(group, prefix_batch(group, pad_token_id), call, resumed))
    return calls


def take_output(samples: Sequence[PartialSample], out: Batch, version: int, cap: int) -> int:
    """Append a call's output ``out`` (the contract of `RolloutEngine.generate`, one row per sample) to
    ``samples``, each new token stamped with ``version``; a sample finishes on ``"stop"`` or at ``cap``
    response tokens in all. Returns the tokens kept."""
    rows = zip(
        out["responses"].tolist(),
        out["rollout_log_probs"].tolist(),
        out["response_lengths"].tolist(),
        out["finish_reason"],
        strict=True,
    )
    kept = 0
    for sample, (ids, log_probs, length, reason) in zip(samples, rows, strict=True):
        sample.token_ids.extend(ids[:length])
        sample.log_probs.extend(log_probs[:length])
        sample.versions.extend([version] * length)
        sample.rounds += 1
        kept += length
        if reason == "stop":
            sample.finish_reason = "stop"
        elif len(sample.token_ids) >= cap:
            sample.finish_reason = "length"
    return kept


def run_round(
    generate: Generate,
    samples: Sequence[PartialSample],
    sampling: SamplingParams,
    budget: int | None,
    version: int,
    pad_token_id: int,
) -> RoundReport:
    """Give every unfinished sample of ``samples`` up to ``budget`` more tokens (None: up to its cap),
    stamped with ``version``; updates the samples in place.

    Args:
        generate: the generation call (`Generate`); it is called once per distinct budget, with one
            row per unfinished sample of that budget (no unfinished sample: not called).
        samples: the samples; finished ones are left as they are.
        sampling: how to sample; ``max_new_tokens`` is each sample's cap over all its rounds, ``n`` is
            ignored (every sample is one row).
        budget: the most new tokens of a sample in this round (>= 1), or None.
        version: the policy version of the weights ``generate`` samples with.
        pad_token_id: pads the prefixes fed back.
    """
    calls = round_calls(samples, sampling, budget, pad_token_id)
    kept = 0
    for call in calls:
        kept += take_output(call.samples, generate(call.prompts, call.sampling), version, sampling.max_new_tokens)
    live = [sample for call in calls for sample in call.samples]
    finished = [sample for sample in live if sample.finished]
    paused = [sample for sample in live if not sample.finished]
    return RoundReport(finished, paused, sum(call.resumed for call in calls), kept)


def response_columns(samples: Sequence[PartialSample], width: int, pad_token_id: int) -> Batch:
    """The response columns of finished ``samples``, one row each, ``width`` columns wide:
    ``responses``, ``response_mask``, ``rollout_log_probs``, ``token_versions`` (int64, the policy
    version of each token, 0 on padding), ``response_lengths`` and non-tensor ``finish_reason`` (as
    `RolloutEngine.generate`)."""
    rows = len(samples)
    responses = torch.full((rows, width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    log_probs = torch.zeros((rows, width), dtype=torch.float32)
    versions = torch.zeros((rows, width), dtype=torch.long)
    for row, sample in enumerate(samples):
        if not sample.finished:
            raise ValueError(
                f"sample {row} (group {sample.group}) has not finished; only finished samples train"
            )
        length = len(sample.token_ids)
        responses[row, :length] = torch.as_tensor(sample.token_ids, dtype=torch.long)
        mask[row, :length] = 1
        log_probs[row, :length] = torch.as_tensor(sample.log_probs, dtype=torch.float32)
        versions[row, :length] = torch.as_tensor(sample.versions, dtype=torch.long)
    return Batch(
        {
            "responses": responses,
            "response_mask": mask,
            "rollout_log_probs": log_probs,
            "token_versions": versions,
            "response_lengths": mask.sum(-1),
        },
        {"finish_reason": [sample.finish_reason for sample in samples]},
    )
