"""DAPO (Yu et al. 2025, arXiv 2503.14476): GRPO with clip-higher, token-mean, dynamic sampling and overlong
shaping, as one step function.

What the config sets (config.yaml): clip-higher (``actor.clip_eps_low`` 0.2, ``clip_eps_high`` 0.28),
``token-mean`` over the global batch, and no KL.
What the step adds:

- over-sampling: each generation round samples ``recipe.oversample`` batches of ``data.train_batch_size``
  prompts (the paper's 3), so that one round usually fills the batch;
- dynamic sampling by accuracy: a group is kept when its accuracies (the reward function's scores, before
  the overlong punishment) are not all equal, for a 0/1 reward 0 < #correct < G; rounds continue until
  ``data.train_batch_size`` groups are kept, at most ``recipe.max_rounds``;
- the soft overlong punishment (``overlong_penalty``: 0 up to L_max - L_cache, a linear ramp to -1 inside
  the cache, -1 beyond; L_max = ``data.max_response_length``, L_cache = ``recipe.overlong_cache_length``),
  added to the accuracy to make the reward the advantages use;
- overlong filtering: samples cut by the length limit carry no loss.

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

from hybridflow.algos import group_index, last_valid_token_mask
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.protocol import Batch
from hybridflow.rewards.shaping import overlong_penalty
from trainer.config import RunConfig, load_config, recipe_field, recipe_settings
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import add_group_ids, advantages, concat_rollouts, generate, score, update_actor

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/dapo/data")  # config.yaml's data.train_files / val_files point here


@dataclass(frozen=True)
class DapoSettings:
    """``recipe.*`` keys: prompt batches per generation round, the cap on rounds per step, the overlong
    punishment's cache length, and whether truncated samples are filtered."""

    oversample: int = recipe_field(3, ge=1)
    max_rounds: int = recipe_field(4, ge=1)
    overlong_cache_length: int = recipe_field(2, ge=1)
    filter_truncated: bool = True


def dapo_settings(config: RunConfig) -> DapoSettings:
    """The ``recipe.*`` keys of ``config``. Refuses a ``reward.shaping``: the step adds the overlong
    punishment itself and filters groups by the reward before it, which a configured shaping would blur."""
    if config.reward.shaping:
        names = [step.name for step in config.reward.shaping]
        raise ValueError(
            f"recipes/dapo: reward.shaping must be empty, got {names}; the step adds the overlong punishment "
            "itself (recipe.overlong_cache_length) and keeps groups by the unshaped reward"
        )
    settings = recipe_settings(config, DapoSettings)
    if settings.overlong_cache_length > config.data.max_response_length:
        raise ValueError(
            f"recipe.overlong_cache_length={settings.overlong_cache_length} is more than "
            f"data.max_response_length={config.data.max_response_length}"
        )
    return settings


def informative_groups(rollouts: Batch) -> Batch:
    """The rows of groups whose ``accuracy`` is not all equal: for a 0/1 accuracy, 0 < #correct < G. A group
    the overlong punishment splits but whose accuracies are equal is dropped (its spread is length only)."""
    index, count = group_index(rollouts["group_ids"])
    accuracy = rollouts["accuracy"].double()
    high = torch.full((count,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, accuracy, "amax")
    low = torch.full((count,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, accuracy, "amin")
    return rollouts[torch.nonzero((high > low)[index]).flatten()]


def round_prompts(
    first: Batch | None, next_prompts: Callable[[], Batch], batches: int, pad_token_id: int
) -> Batch:
    """Over-sampling: the prompts of one generation round, ``batches`` prompt batches joined (``first``,
    the step's own batch, then further batches from ``next_prompts``), left-padded to the widest."""
    parts = [] if first is None else [first]
    parts += [next_prompts() for _ in range(batches - len(parts))]
    return parts[0] if len(parts) == 1 else concat_rollouts(parts, pad_token_id)


def fill_batch(
    sample_round: Callable[[int], Batch], groups_wanted: int, group_size: int, max_rounds: int, pad_token_id: int
) -> tuple[Batch | None, dict[str, float]]:
    """Dynamic sampling: call ``sample_round(round)`` (rollouts with ``accuracy``, ``group_size`` rows per
    prompt) until ``groups_wanted`` informative groups are kept or ``max_rounds`` rounds ran; the first
    ``groups_wanted`` kept groups, renumbered, and the ``dapo/*`` metrics. ``None`` when no group was
    informative."""
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


def dapo_scores(runtime: Runtime, rollouts: Batch, settings: DapoSettings) -> Batch:
    """``accuracy [batch]``: the configured reward (`score`); ``scores [batch]`` and ``token_level_scores
    [batch, response_len]`` (at the last response token): the accuracy plus the soft overlong punishment."""
    accuracy = score(runtime, rollouts)["scores"]
    shaped = overlong_penalty(
        accuracy,
        rollouts,
        max_response_length=runtime.config.data.max_response_length,
        cache_length=settings.overlong_cache_length,
    )
    last = last_valid_token_mask(rollouts["response_mask"].bool())
    return Batch({"accuracy": accuracy, "scores": shaped, "token_level_scores": last.float() * shaped[:, None]})


def dapo_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One DAPO step: over-sampled rounds of sampling and scoring until the batch is full of groups of
    mixed accuracy, then one update."""
    settings = dapo_settings(runtime.config)
    pad = runtime.tokenizer.pad_token_id

    def sample_round(round_index: int) -> Batch:
        batch = round_prompts(prompts if round_index == 0 else None, runtime.next_prompts, settings.oversample, pad)
        rollouts = generate(runtime, batch)
        return rollouts | dapo_scores(runtime, rollouts, settings)  # accuracy, then + overlong punishment

    rollouts, metrics = fill_batch(sample_round, len(prompts), runtime.config.rollout.n, settings.max_rounds, pad)
    runtime.record(metrics)
    if rollouts is None:  # every group had equal accuracy in every round: nothing to learn this step
        return prompts
    rollouts |= advantages(runtime, rollouts)  # group-relative (GRPO) over the kept groups, shaped rewards
    if settings.filter_truncated:
        rollouts = without_truncated_tokens(rollouts)
    update_actor(runtime, rollouts)  # clip-higher, token-mean over the global batch, no KL
    return rollouts


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_arithmetic_splits(DATA)  # 2-digit addition, bare style ("47+38=" -> "85")
    config = load_config(HERE / "config.yaml", overrides)
    dapo_settings(config)  # a bad recipe.* key or a reward.shaping fails here, before anything starts
    with start_ray(config), Runtime(config) as runtime:
        return fit(runtime, dapo_step)


if __name__ == "__main__":
    main(sys.argv[1:])
