"""DAPO (Yu et al. 2025, arXiv 2503.14476): GRPO with clip-higher, token-mean, dynamic sampling and overlong
shaping, as one step function.

What the config sets (config.yaml): clip-higher (``actor.clip_eps_low`` 0.2, ``clip_eps_high`` 0.28),
``token-mean`` over the global batch, no KL, and the soft overlong punishment as a reward shaping
(``overlong_penalty``: 0 up to L_max - L_cache, a linear ramp to -1 inside the cache, -1 beyond).
What the step adds: dynamic sampling (groups whose rewards are all equal teach nothing, so they are dropped
and more prompts are sampled until the batch is full, at most ``recipe.max_rounds`` rounds), and overlong
filtering (samples cut by the length limit carry no loss).

Run:  python -m recipes.dapo.main [key=value overrides of config.yaml]
(or python recipes/dapo/main.py ...)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hybridflow.algos import group_index
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.protocol import Batch
from trainer.config import load_config, recipe_field, recipe_settings
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import add_group_ids, advantages, concat_rollouts, generate, score, update_actor

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/dapo/data")  # config.yaml's data.train_files / val_files point here


@dataclass(frozen=True)
class DapoSettings:
    """``recipe.*`` keys: the cap on generation rounds per step, and whether truncated samples are filtered."""

    max_rounds: int = recipe_field(4, ge=1)
    filter_truncated: bool = True


def informative_groups(rollouts: Batch) -> Batch:
    """The rows of groups whose ``scores`` are not all equal (a group of equal rewards has zero advantage)."""
    index, count = group_index(rollouts["group_ids"])
    scores = rollouts["scores"].double()
    high = torch.full((count,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amax")
    low = torch.full((count,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amin")
    return rollouts[torch.nonzero((high > low)[index]).flatten()]


def fill_batch(
    sample_round: Callable[[int], Batch], groups_wanted: int, group_size: int, max_rounds: int, pad_token_id: int
) -> tuple[Batch | None, dict[str, float]]:
    """Dynamic sampling: call ``sample_round(round)`` (scored rollouts, ``group_size`` rows per prompt) until
    ``groups_wanted`` informative groups are kept or ``max_rounds`` rounds ran; the first ``groups_wanted``
    kept groups, renumbered, and the ``dapo/*`` metrics. ``None`` when no group was informative."""
    kept: list[Batch] = []
    sampled = kept_rows = rounds = 0
    while rounds < max_rounds and kept_rows < groups_wanted * group_size:
        rollouts = sample_round(rounds)
        rounds += 1
        sampled += len(rollouts) // group_size
        useful = informative_groups(rollouts)
        if len(useful):
            kept.append(useful)
            kept_rows += len(useful)
    metrics = {
        "dapo/rounds": float(rounds),
        "dapo/prompts_sampled": float(sampled),
        "dapo/prompts_kept": float(min(kept_rows // group_size, groups_wanted)),
        "dapo/kept_fraction": kept_rows / group_size / sampled,
    }
    if not kept:
        return None, metrics
    batch = concat_rollouts(kept, pad_token_id)[: groups_wanted * group_size]
    batch.pop("group_ids")
    return batch | add_group_ids(batch, group_size), metrics


def without_truncated_tokens(rollouts: Batch) -> Batch:
    """Overlong filtering: the ``response_mask`` of samples stopped by the length limit becomes all zero, so
    they carry no loss and do not count in token-mean."""
    truncated = torch.as_tensor(np.asarray(rollouts["finish_reason"]) == "length")
    mask = rollouts.pop("response_mask")["response_mask"]
    return rollouts | Batch({"response_mask": mask * ~truncated[:, None]})


def dapo_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One DAPO step: sample and score until the batch is full of informative groups, then one update."""
    settings = recipe_settings(runtime.config, DapoSettings)

    def sample_round(round_index: int) -> Batch:
        batch = prompts if round_index == 0 else runtime.next_prompts()  # over-sample more prompts
        rollouts = generate(runtime, batch)
        return rollouts | score(runtime, rollouts)  # exact match + overlong punishment (config shaping)

    rollouts, metrics = fill_batch(
        sample_round, len(prompts), runtime.config.rollout.n, settings.max_rounds, runtime.tokenizer.pad_token_id
    )
    runtime.record(metrics)
    if rollouts is None:  # every group had equal rewards in every round: nothing to learn this step
        return prompts
    rollouts |= advantages(runtime, rollouts)  # group-relative (GRPO) over the kept groups
    if settings.filter_truncated:
        rollouts = without_truncated_tokens(rollouts)
    update_actor(runtime, rollouts)  # clip-higher, token-mean over the global batch, no KL
    return rollouts


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_arithmetic_splits(DATA)  # 2-digit addition, bare style ("47+38=" -> "85")
    config = load_config(HERE / "config.yaml", overrides)
    recipe_settings(config, DapoSettings)  # a bad recipe.* key fails here, before anything starts
    with start_ray(config), Runtime(config) as runtime:
        return fit(runtime, dapo_step)


if __name__ == "__main__":
    main(sys.argv[1:])
