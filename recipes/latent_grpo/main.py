"""Latent-GRPO (Deng et al. 2026, "Latent-GRPO: Group Relative Policy Optimization for Latent Reasoning",
arXiv 2604.27998): GRPO for a model that reasons in continuous superposition steps before its answer.

A rollout runs a latent phase (each step a soft mixture of the top-K token embeddings under one-sided Gumbel
noise, `recipes.latent_grpo.latent`) until end-of-thinking comes out on top, then samples the answer
explicitly (`recipes.latent_grpo.rollout`, in the worker class `recipes.latent_grpo.worker.LatentActor`).
A latent step's log-prob in training is the mean Gumbel log-density of its stored candidates, with the
straight-through flip where the advantage is <= 0 (the gradient keeps its sign, its size is bounded).
Groups whose rewards are all equal are filtered out and the batch refilled; advantages are GRPO's group
z-score with truncated samples masked out and (``recipe.first_position_selection``) one positive first
step kept per group; the loss has the dual clip (``actor.dual_clip_c``).

The model starts from a supervised stage that teaches the latent format on 2-digit addition
(`recipes.latent_grpo.sft`). ``recipe.variant: explicit`` runs the baseline instead: the same supervised
stage on the explicit chain, then plain GRPO (the configured step, `trainer.algorithms.rl_step`).

Run:  python -m recipes.latent_grpo.main [key=value overrides of config.yaml]
(or python recipes/latent_grpo/main.py ...)
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from hybridflow.contract import MODEL_INPUTS, step_columns
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.protocol import Batch
from hybridflow.row_order import balanced_update_order
from recipes.latent_grpo.latent import LatentSampling, informative_groups, latent_grpo_advantages
from recipes.latent_grpo.rollout import LATENT_COLUMNS
from recipes.latent_grpo.sft import SFTConfig, supervised_model
from recipes.latent_grpo.task import END_OF_THINKING
from recipes.latent_grpo.worker import LatentActor
from trainer.algorithms import rl_step
from trainer.config import RunConfig, load_config, recipe_field, recipe_settings
from trainer.fit import StopAt, fit
from trainer.model_setup import prepare_model_dir
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import add_group_ids, concat_rollouts, generate, score

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/latent_grpo/data")  # config.yaml's data.train_files / val_files point here
CACHE = Path(".cache/recipes/latent_grpo")


@dataclass(frozen=True)
class LatentGRPOSettings:
    """``recipe.*`` keys: which variant runs, the latent step's sampling, first-position selection, group
    filtering (at most ``max_rounds`` generation rounds per step), the supervised stage, and an optional
    budget of training seconds (0: run ``trainer.total_steps``)."""

    variant: Literal["latent", "explicit"] = "latent"
    top_k: int = recipe_field(10, ge=1)
    tau: float = recipe_field(1.0, gt=0)
    noise_scale: float = recipe_field(0.1, ge=0)
    first_position_selection: bool = True
    filter_groups: bool = True
    max_rounds: int = recipe_field(4, ge=1)
    sft_steps: int = recipe_field(300, ge=1)
    sft_batch_size: int = recipe_field(128, ge=1)
    sft_lr: float = recipe_field(3e-3, gt=0)
    time_budget_s: float = recipe_field(0.0, ge=0)


@step_columns(reads=(*MODEL_INPUTS, *LATENT_COLUMNS), writes=("old_log_probs",))
def latent_old_log_probs(runtime: Runtime, rollouts: Batch) -> Batch:
    """``old_log_probs [batch, response_len]``: latent positions' Gumbel log-densities and explicit
    tokens' log-probs under the current policy, in the training layout."""
    with runtime.timer.phase("log_prob"):
        return runtime.actor.compute_log_prob(
            rollouts.select(*MODEL_INPUTS, *LATENT_COLUMNS, meta=False), temperature=runtime.config.rollout.temperature
        )


@step_columns(reads=("scores", "response_mask", "group_ids", "old_log_probs", "finish_reason"), writes=("advantages",))
def latent_advantages(rollouts: Batch, select_first: bool) -> Batch:
    """``advantages [batch, response_len]`` (`latent_grpo_advantages`, with first-position selection when
    ``select_first``); a row is truncated when it hit the length limit."""
    truncated = torch.tensor([reason == "length" for reason in rollouts["finish_reason"]])
    return Batch(
        {
            "advantages": latent_grpo_advantages(
                rollouts["scores"],
                rollouts["response_mask"],
                rollouts["group_ids"],
                truncated,
                rollouts["old_log_probs"],
                select_first,
            )
        }
    )


def filtered_rollouts(runtime: Runtime, prompts: Batch, settings: LatentGRPOSettings) -> Batch | None:
    """Scored latent rollouts of ``prompts``; with ``filter_groups``, only groups whose scores are not all
    equal (`informative_groups`), refilled from further prompts until the step's ``len(prompts)``
    groups are kept or ``max_rounds`` rounds ran, renumbered. ``None`` when no group was kept.
    Records ``latent/rounds`` and ``latent/kept_fraction`` (kept groups / sampled groups)."""
    group_size = runtime.config.rollout.n
    wanted = len(prompts) * group_size
    kept: list[Batch] = []
    kept_rows = sampled_rows = rounds = 0
    while rounds == 0 or (settings.filter_groups and rounds < settings.max_rounds and kept_rows < wanted):
        rollouts = generate(runtime, prompts if rounds == 0 else runtime.next_prompts())  # latent phase, answer
        rollouts |= score(runtime, rollouts)  # the answer after end-of-thinking
        rounds += 1
        sampled_rows += len(rollouts)
        if settings.filter_groups:
            rollouts = rollouts[torch.nonzero(informative_groups(rollouts["scores"], rollouts["group_ids"])).flatten()]
        if len(rollouts):
            kept.append(rollouts)
            kept_rows += len(rollouts)
    runtime.record({"latent/rounds": float(rounds), "latent/kept_fraction": min(kept_rows, wanted) / sampled_rows})
    if not kept:
        return None
    batch = concat_rollouts(kept, runtime.tokenizer.pad_token_id)[:wanted]
    batch.pop("group_ids")
    return batch | add_group_ids(batch, group_size)


@step_columns(reads=(*MODEL_INPUTS, *LATENT_COLUMNS, "advantages", "old_log_probs"))
def latent_update_actor(runtime: Runtime, rollouts: Batch) -> None:
    """One actor update on the latent rollouts (the configured clipped objective); records ``actor/*``."""
    batch = rollouts.select(*MODEL_INPUTS, *LATENT_COLUMNS, "advantages", "old_log_probs", meta=False)
    order = balanced_update_order(batch, runtime.actor.world_size, runtime.config.actor.ppo_mini_batch_size)
    with runtime.timer.phase("update"):
        runtime.record(runtime.actor.update_actor(batch.reorder(order), temperature=runtime.config.rollout.temperature)[0])


def reasoning_metrics(rollouts: Batch) -> dict[str, float]:
    """``latent/*``: latent steps and explicit tokens per response, and their sum (the reasoning length)."""
    latent = rollouts["latent_mask"].sum(-1).float()
    length = rollouts["response_mask"].sum(-1).float()
    return {
        "latent/latent_steps_mean": latent.mean().item(),
        "latent/explicit_tokens_mean": (length - latent).mean().item(),
        "latent/reasoning_length_mean": length.mean().item(),
    }


def latent_grpo_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One Latent-GRPO step: latent rollouts and reward (group filtering refills the batch), old
    log-probs, masked advantages, update."""
    settings = recipe_settings(runtime.config, LatentGRPOSettings)
    rollouts = filtered_rollouts(runtime, prompts, settings)  # LatentActor: latent phase, then the answer
    if rollouts is None:  # every group scored the same in every round: nothing to learn this step
        return prompts
    rollouts |= latent_old_log_probs(runtime, rollouts)  # Gumbel log-densities at latent positions
    rollouts |= latent_advantages(rollouts, settings.first_position_selection)  # z-score, truncated out
    latent_update_actor(runtime, rollouts)  # clipped surrogate, dual clip; flip (sign kept) where A <= 0
    runtime.record(reasoning_metrics(rollouts))
    return rollouts


def latent_sampling(runtime: Runtime, settings: LatentGRPOSettings) -> LatentSampling:
    eot = runtime.tokenizer.convert_tokens_to_ids(END_OF_THINKING)
    return LatentSampling(settings.top_k, settings.tau, settings.noise_scale, eot)


def with_supervised_start(config: RunConfig, overrides: list[str], settings: LatentGRPOSettings) -> RunConfig:
    """``config`` starting from its tiny model after the supervised stage in the variant's format (unless
    ``model.path`` names a model already)."""
    if config.model.path is not None:
        return config
    sft = SFTConfig(settings.sft_steps, settings.sft_batch_size, settings.sft_lr, config.model.tiny.seed)
    initial = prepare_model_dir(config, CACHE)
    model_dir = supervised_model(initial, config.data.train_files, settings.variant, CACHE, sft)
    return load_config(HERE / "config.yaml", [*overrides, f"model.path={model_dir}"])


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_arithmetic_splits(DATA)  # 2-digit addition, bare style ("47+38=" -> "85")
    config = load_config(HERE / "config.yaml", overrides)
    settings = recipe_settings(config, LatentGRPOSettings)
    config = with_supervised_start(config, overrides, settings)
    # The budget counts the steps' seconds (validation and start-up do not); fit validates at the end.
    stop = StopAt(seconds=settings.time_budget_s) if settings.time_budget_s else None
    if settings.variant == "explicit":
        with start_ray(config), Runtime(config) as runtime:
            return fit(runtime, rl_step, stop=stop)
    with start_ray(config), Runtime(config, worker_classes={"actor_rollout": LatentActor}) as runtime:
        runtime.actor.set_latent_sampling(latent_sampling(runtime, settings))
        return fit(runtime, latent_grpo_step, stop=stop)

if __name__ == "__main__":
    main(sys.argv[1:])
