"""Synchronous colocated GRPO against synchronous GRPO with partial rollouts, on a long-tail task, on the
same cores.

The task is `bench_async_rollout`'s: every 10th prompt (10%) asks for a long answer, and a random tiny
Qwen2 (``--hidden``, ``--layers``, fp32) that almost never writes its end token stands in for a policy.
A prompt's answer ends after ``--long-tokens`` response tokens for the long prompts and
``--long-tokens / --tail-ratio`` (8x fewer by default) for the others: the actor's worker class here
(`LongTailEnd`) gives each row of an engine call at most the tokens its prompt has left and reports the
row as stopped when they are used up, so a sample paused by a partial round and fed back as a prefix
ends where an uninterrupted one does. Both sides use that worker class; the reward is the share of a
target character (varied, so every step updates).

Two sides, each a fresh run of ``--steps`` GRPO steps (``trainer.algorithms.rl_step``) on ``--slots``
colocated device slots (CPU processes of one core each), one after the other (``--partial-first``
swaps the order, to tell an order effect from the host's load):

- **sync colocated**: the default hybrid engine; each step waits for its longest sample;
- **partial rollouts**: ``async_rollout.partial_round_tokens`` = the short answer's length and
  ``max_staleness`` = ``--tail-ratio`` (a long sample needs that many rounds, at least one a step, so it
  is never forced to finish early): a step trains the ``data.train_batch_size`` oldest prompts whose
  samples all finished, and long samples go on in later steps (docs/rollout_service.md);
- **partial on the rollout pool** (with ``--pool``): the same partial rollouts with the actor on
  ``--slots - 1`` slots and the engine on a rollout pool of 1 slot, streaming: each step leaves one
  round running on the pool while the actor updates (docs/rollout_service.md, "Streaming on the
  rollout pool"), so the engine and the actor together use the same ``--slots`` cores.

Reported over two windows: the steps after the first (warm-up), and the steady steps, from step
``tail_ratio + 2`` on, once the partial side trains long samples too (before, its steps train short
samples only, so its updates are smaller). Per window: generated response tokens per second of the
whole system (every token generated, paused ones included, over the summed step wall time), the median
step time, and the phase split: the engines' generation seconds (``timing_s/generate``, summed over a
step's blocking calls; the pool's round during the update is not in it, but is the ``pool round``
column, ``async/pool_generate_s``; ``pool idle`` is the pool's seconds without work, ``async/pool_idle_s``,
and ``wait`` the trainer's wait for the round, ``async/trainer_wait_s``), the generation phase with its
layout switches (``timing_s/generation``), the update,
the response tokens trained per step, the rounds per step and the mean staleness. The ratios are
each partial side over sync. The host's load (``os.getloadavg``) is printed before and after.

    RAY_AUTH_MODE=disabled python benchmarks/bench_partial_rollout.py [--steps 20] [--prompts 20] [--n 4]
        [--long-tokens 128] [--tail-ratio 8] [--hidden 128] [--layers 4] [--slots 2] [--partial-first] [--pool]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_async_rollout import TAIL_EVERY, _write_task, task_overrides, task_parser

from hybridflow.data import PromptDataset
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.sampling import SamplingParams
from trainer.algorithms import rl_step
from trainer.config import load_config
from trainer.fit import fit
from trainer.model_setup import load_tokenizer, prepare_model_dir
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from workers.actor import ActorRolloutRefWorker
from workers.rollout import RolloutWorker

RESPONSE_COLUMNS = ("responses", "response_mask", "rollout_log_probs")
SYNC_SIDE = "sync colocated"
POOL_SIDE = "partial on the rollout pool"


class EndsAtPromptLength:
    """A worker mixin whose engine ends each answer at its prompt's length: ``long_tokens`` response
    tokens for a prompt holding the id ``long_id`` among its first ``prompt_len`` ids, ``short_tokens``
    for the others (class attributes set by `main` before the workers start; the classes travel to them
    with their attributes). A row's response so far is what its input holds past ``prompt_len`` ids (every
    prompt of the task has that length), so a prefix fed back by a partial round is counted."""

    long_tokens = 128
    short_tokens = 16
    prompt_len = 0
    long_id = 0

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        rows = [ids[mask.bool()] for ids, mask in zip(prompts["input_ids"], prompts["attention_mask"], strict=True)]
        long = np.array([bool((row[: self.prompt_len] == self.long_id).any()) for row in rows])
        left = np.where(long, self.long_tokens, self.short_tokens) - np.array([len(r) - self.prompt_len for r in rows])
        budgets = np.minimum(left, sampling.max_new_tokens)
        width = sampling.max_new_tokens
        parts, order = [], []
        for budget in sorted(set(budgets.tolist())):
            index = np.flatnonzero(budgets == budget)
            part = engine.generate(prompts.reorder(index), dataclasses.replace(sampling, max_new_tokens=int(budget)))
            ended = [
                "stop" if reason == "stop" or int(length) >= left[index[i // sampling.n]] else reason
                for i, (reason, length) in enumerate(zip(part["finish_reason"], part["response_lengths"], strict=True))
            ]
            pad = width - int(budget)
            part = part.select(*[k for k in part.keys() if k not in (*RESPONSE_COLUMNS, "finish_reason")]) | Batch(
                {c: torch.nn.functional.pad(part[c], (0, pad), value=0) for c in RESPONSE_COLUMNS},
                {"finish_reason": ended},
            )
            parts.append(part)
            order += [prompt * sampling.n + j for prompt in index.tolist() for j in range(sampling.n)]
        return Batch.concat(parts).reorder(np.argsort(order))


class LongTailEnd(EndsAtPromptLength, ActorRolloutRefWorker):
    """The shipped actor, its colocated engine ending answers as `EndsAtPromptLength` says."""


class LongTailEndRollout(EndsAtPromptLength, RolloutWorker):
    """The shipped rollout worker (a pool of its own), its engine ending answers as `LongTailEnd`'s."""


def _config(root: Path, args: argparse.Namespace, side: str) -> object:
    short = args.long_tokens // args.tail_ratio
    overrides = task_overrides(root, args, side)
    if side == POOL_SIDE:
        overrides += [
            f"resource.slots_per_node={args.slots - 1}",
            "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
            "resource.placement={rollout: rollout_pool}",
        ]
    else:
        overrides.append(f"resource.slots_per_node={args.slots}")
    if side != SYNC_SIDE:
        overrides += [
            f"async_rollout.partial_round_tokens={short}",
            f"async_rollout.max_staleness={args.tail_ratio}",
            "actor.rollout_correction=token",
        ]
    return load_config(None, overrides)


def _summary(log: list[dict[str, float]], args: argparse.Namespace) -> dict[str, float]:
    seconds = [r["timing_s/step"] for r in log]

    def mean(key: str) -> float:
        return sum(r.get(key, 0.0) for r in log) / len(log)

    return {
        "tokens_per_s": sum(r["response/generated_tokens"] for r in log) / sum(seconds),
        "step_s": statistics.median(seconds),
        "generate_s": mean("timing_s/generate"),
        "generation_s": mean("timing_s/generation"),
        "update_s": mean("timing_s/update"),
        "trained_tokens": mean("response_length/mean") * args.prompts * args.n,
        "rounds": mean("partial/rounds"),
        "staleness": mean("async/staleness_mean"),
        "pool_s": mean("async/pool_generate_s"),
        "pool_idle_s": mean("async/pool_idle_s"),
        "wait_s": mean("async/trainer_wait_s"),
    }


def _run(root: Path, args: argparse.Namespace, side: str) -> dict[str, dict[str, float]]:
    """The side's summaries over the steps after the first (warm-up), and over the steady steps: from
    step ``tail_ratio + 2`` on, when the partial side's first long samples (one round a step) train."""
    config = _config(root, args, side)
    classes = {"actor_rollout": LongTailEnd, **({"rollout": LongTailEndRollout} if side == POOL_SIDE else {})}
    with start_ray(config), Runtime(config, worker_classes=classes) as runtime:
        fit(runtime, rl_step)
    log = read_jsonl(root / side / "metrics.jsonl")
    return {
        f"steps 2..{args.steps}": _summary(log[1:], args),
        f"steps {args.tail_ratio + 2}..{args.steps}": _summary(log[args.tail_ratio + 1 :], args),
    }


def _prompt_ids(root: Path, args: argparse.Namespace) -> tuple[int, int]:
    """The task's prompt length in ids and the id that marks a long prompt (the digit 0: prompt i reads
    ``f"{i % 10}..."`` and every 10th is long), through the trainer's own tokenizer and dataset."""
    config = _config(root, args, SYNC_SIDE)
    tokenizer = load_tokenizer(config, prepare_model_dir(config, root / "model_probe"))
    data = PromptDataset([str(root / "train.parquet")], tokenizer, config.data.max_prompt_length)
    ids = [list(data[i]["input_ids"]) for i in range(len(data))]
    long_id = tokenizer.convert_tokens_to_ids("0")
    if len({len(row) for row in ids}) != 1:
        raise ValueError(f"the task's prompts should share one length in ids, got {sorted({len(r) for r in ids})}")
    if [long_id in row for row in ids] != [i % TAIL_EVERY == 0 for i in range(len(ids))]:
        raise ValueError("the id of '0' should mark exactly the long prompts (every 10th)")
    return len(ids[0]), long_id


def main() -> None:
    parser = task_parser(__doc__, steps=20)
    parser.add_argument("--partial-first", action="store_true", help="run the partial sides first")
    parser.add_argument(
        "--pool", action="store_true", help="add the side with partial rollouts streamed on a rollout pool of its own"
    )
    args = parser.parse_args()
    print(f"load before: {os.getloadavg()}")
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        # Enough prompts for the partial side's extra batch at the start.
        _write_task(root, args.prompts * (args.steps + 1))
        EndsAtPromptLength.long_tokens = args.long_tokens
        EndsAtPromptLength.short_tokens = args.long_tokens // args.tail_ratio
        EndsAtPromptLength.prompt_len, EndsAtPromptLength.long_id = _prompt_ids(root, args)
        sides = (SYNC_SIDE, "partial rollouts", *((POOL_SIDE,) if args.pool else ()))
        for side in (*sides[1:], sides[0]) if args.partial_first else sides:
            results[side] = _run(root, args, side)
            print(side, results[side], flush=True)
    print(f"load after: {os.getloadavg()}")
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, fp32; {args.prompts} prompts x {args.n} samples per step, "
        f"10% of prompts with {args.long_tokens} response tokens, the rest {args.long_tokens // args.tail_ratio}; "
        f"{args.slots} slots"
    )
    keys = (
        "tokens_per_s", "step_s", "generate_s", "generation_s", "update_s", "trained_tokens", "rounds", "staleness",
        "pool_s", "pool_idle_s", "wait_s",
    )
    header = (
        "steps", "side", "tokens/s", "step s", "generate s", "generation s", "update s", "trained tokens", "rounds",
        "staleness", "pool round s", "pool idle s", "wait s",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for window in results[SYNC_SIDE]:
        for side in sides:
            summaries = results[side]
            print(f"| {window} | {side} | " + " | ".join(f"{summaries[window][k]:.2f}" for k in keys) + " |")
    for window in results[SYNC_SIDE]:
        sync = results[SYNC_SIDE][window]
        for side in sides[1:]:
            partial = results[side][window]
            print(
                f"{window}: {side} / sync colocated: {partial['tokens_per_s'] / sync['tokens_per_s']:.2f}x generated "
                f"tokens per second; median step {sync['step_s'] / partial['step_s']:.2f}x shorter"
            )


if __name__ == "__main__":
    main()
