"""Sizes and values that follow from a run config, computed in this one place and never written back
into it.

The same code checks that the sizes divide (reporting through :class:`Problems` during validation) and
computes them (:func:`derive_sizes`), so the rules and the arithmetic cannot drift apart.
:func:`derive_values` gives each worker role what it takes from outside its own sections.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hybridflow.algos import AGGREGATION_MODES
from hybridflow.rollout.config import EngineDerived
from trainer.config.problems import Problems
from trainer.config.schema import GLOBAL_POOL, OptimizedRoleConfig, RunConfig
from workers.config import ActorDerived, CriticDerived

__all__ = [
    "DerivedSizes",
    "DerivedValues",
    "UpdateSizes",
    "check_sizes",
    "derive_sizes",
    "derive_values",
    "unknown_pool",
]

_WORLD_KEYS = ("resource.nodes", "resource.slots_per_node", "resource.placement", "resource.pools")


@dataclass(frozen=True)
class UpdateSizes:
    """Batch geometry of one training role's update (actor or critic), in rows.

    Attributes:
        world_size: data-parallel ranks of the role (FSDP shards over all of them).
        mini_batch_size: rows per optimizer step, across all ranks (``ppo_mini_batch_size``).
        mini_batches_per_epoch: optimizer steps per pass over one step's rows.
        optimizer_steps_per_step: ``mini_batches_per_epoch * ppo_epochs``.
        mini_batch_per_rank: rows of one mini-batch on one rank.
        micro_batch_per_rank: rows per forward/backward on one rank; null under dynamic batching.
        grad_accum_steps: micro-batches per mini-batch on one rank; null under dynamic batching,
            where the count follows the tokens of each mini-batch.
    """

    world_size: int
    mini_batch_size: int
    mini_batches_per_epoch: int
    optimizer_steps_per_step: int
    mini_batch_per_rank: int
    micro_batch_per_rank: int | None
    grad_accum_steps: int | None


@dataclass(frozen=True)
class DerivedSizes:
    """Per-step and per-rank sizes of a run.

    Attributes:
        world_size: ranks of the actor's pool (which holds the engines too unless the rollout is split).
        rollout_tp_size: ranks per inference engine (``rollout.tp_size``).
        rollout_dp_size: inference engines, i.e. data-parallel groups of the inference layout.
        prompts_per_step: ``data.train_batch_size``.
        rows_per_step: ``prompts_per_step * rollout.n``.
        prompts_per_rollout_dp_rank: prompts each inference engine generates for per step.
        actor: the actor's update sizes.
        critic: the critic's update sizes; null without a critic.
    """

    world_size: int
    rollout_tp_size: int
    rollout_dp_size: int
    prompts_per_step: int
    rows_per_step: int
    prompts_per_rollout_dp_rank: int
    actor: UpdateSizes
    critic: UpdateSizes | None


def derive_sizes(config: RunConfig) -> DerivedSizes:
    """The sizes of ``config``.

    Raises:
        ConfigError: a size does not divide. A config from ``load_config`` has been checked already;
            this can only happen to one built or changed by hand (e.g. with ``dataclasses.replace``).
    """
    problems = Problems()
    sizes = check_sizes(config, problems)
    problems.raise_if_any()
    assert sizes is not None  # check_sizes returns None only after recording a problem
    return sizes


@dataclass(frozen=True)
class DerivedValues:
    """What the worker roles take from outside their own sections, beside those sections.

    Attributes:
        actor: the actor/rollout worker's (its ``engine`` holds the engine's).
        critic: the critic worker's; null without a critic.
    """

    actor: ActorDerived
    critic: CriticDerived | None


def derive_values(config: RunConfig, sizes: DerivedSizes, total_steps: int, model_dir: str | Path) -> DerivedValues:
    """The values each worker role of ``config`` takes from outside its sections, for a run of
    ``total_steps`` steps on the policy in ``model_dir``.

    - the learning-rate schedules span ``total_steps * optimizer_steps_per_step`` optimizer steps;
    - the losses' ``seq-mean-token-sum-norm`` constant is ``data.max_response_length``;
    - the engine's dtype is ``rollout.dtype``, or ``model.dtype`` when null, and its ``max_model_len``
      is ``data.max_prompt_length + data.max_response_length``;
    - the shuffles (and the value head's initial weights) are seeded by ``data.seed``;
    - the weights load in ``model.dtype``; the reference policy is held when ``needs_reference``.

    The actor's loss and the critic's aggregation are resolved here, in the controller, where a
    recipe's own registrations exist (they travel to the workers with these values).
    """
    data = config.data
    norm_constant = float(data.max_response_length)
    engine = EngineDerived(
        dtype=config.rollout.dtype or config.model.dtype,
        max_model_len=data.max_prompt_length + data.max_response_length,
    )
    actor = ActorDerived(
        model_path=str(model_dir),
        objective=config.actor.objective(norm_constant),
        dtype=config.model.dtype,
        optimizer_steps=max(1, total_steps * sizes.actor.optimizer_steps_per_step),
        seed=data.seed,
        with_ref=config.needs_reference,
        engine=engine,
        rollout_split=config.resource.splits_rollout,
    )
    critic = None
    if config.critic is not None and sizes.critic is not None:
        critic = CriticDerived(
            model_path=str(model_dir),
            aggregation=AGGREGATION_MODES.get(config.critic.loss_agg_mode),
            dtype=config.model.dtype,
            optimizer_steps=max(1, total_steps * sizes.critic.optimizer_steps_per_step),
            seed=data.seed,
            loss_norm_constant=norm_constant,
        )
    return DerivedValues(actor=actor, critic=critic)


def unknown_pool(config: RunConfig, role: str) -> str | None:
    """Why ``role``'s pool cannot be found, or None when it can."""
    resource = config.resource
    pool = resource.pool_of(role)
    if pool == GLOBAL_POOL or pool in resource.pools:
        return None
    return f"unknown pool {pool!r}; pools: {', '.join((GLOBAL_POOL, *resource.pools))}"


def _world_size(config: RunConfig, role: str, problems: Problems) -> int | None:
    problem = unknown_pool(config, role)
    if problem is not None:
        problems.add(f"resource.placement.{role}", problem)
        return None
    return config.resource.world_size_of(role)


def check_sizes(config: RunConfig, problems: Problems) -> DerivedSizes | None:
    """Compute the sizes, or record in ``problems`` why they do not divide and return None."""
    rollout, data = config.rollout, config.data
    world = _world_size(config, "actor_rollout", problems)
    if world is None:
        return None
    prompts, rows = data.train_batch_size, data.train_batch_size * rollout.n
    engine_role = "rollout" if config.resource.splits_rollout else "actor_rollout"
    engine_world = _world_size(config, engine_role, problems) if engine_role == "rollout" else world
    if engine_world is None:
        return None
    dp = _inference_dp_size(engine_world, prompts, rollout.tp_size, engine_role, problems)
    actor = _update_sizes("actor", config.actor, rows, world, problems)
    critic = None
    if config.critic is not None:
        critic_world = _world_size(config, "critic", problems)
        if critic_world is not None:
            critic = _update_sizes("critic", config.critic, rows, critic_world, problems)
    if dp is None or actor is None or (config.critic is not None and critic is None):
        return None
    return DerivedSizes(
        world_size=world,
        rollout_tp_size=rollout.tp_size,
        rollout_dp_size=dp,
        prompts_per_step=prompts,
        rows_per_step=rows,
        prompts_per_rollout_dp_rank=prompts // dp,
        actor=actor,
        critic=critic,
    )


def _inference_dp_size(world: int, prompts: int, tp_size: int, role: str, problems: Problems) -> int | None:
    """Number of inference engines, if ``tp_size`` divides the world of ``role``'s pool (the engines')
    and the prompts split over them."""
    if world % tp_size:
        divisors = [t for t in range(1, world + 1) if world % t == 0]
        problems.add(
            "rollout.tp_size",
            f"{tp_size} does not divide the world size {world} of the {role} pool (valid tp sizes: {divisors})",
            *_WORLD_KEYS,
        )
        return None
    dp = world // tp_size
    if prompts % dp:
        problems.add(
            "data.train_batch_size",
            f"{prompts} prompts do not split evenly over the {dp} inference data-parallel groups "
            f"(world size {world} / rollout.tp_size {tp_size})",
            "rollout.tp_size",
            *_WORLD_KEYS,
        )
        return None
    return dp


def _update_sizes(
    section: str, role: OptimizedRoleConfig, rows: int, world: int, problems: Problems
) -> UpdateSizes | None:
    mini, micro = role.ppo_mini_batch_size, role.ppo_micro_batch_size
    mini_key, micro_key = f"{section}.ppo_mini_batch_size", f"{section}.ppo_micro_batch_size"
    if rows % mini:
        problems.add(
            mini_key,
            f"{mini} does not divide the rows per step, data.train_batch_size * rollout.n = {rows}",
            "data.train_batch_size",
            "rollout.n",
        )
        return None
    if mini % world:
        problems.add(
            mini_key,
            f"{mini} rows do not split evenly over the data-parallel world of {world} ranks",
            *_WORLD_KEYS,
        )
        return None
    per_rank = mini // world
    if not role.dynamic_batching and per_rank % micro:
        problems.add(
            micro_key,
            f"{micro} * data-parallel world {world} does not divide {mini_key} = {mini} "
            f"(per-rank mini-batch {per_rank})",
            *_WORLD_KEYS,
        )
        return None
    mini_batches = rows // mini
    return UpdateSizes(
        world_size=world,
        mini_batch_size=mini,
        mini_batches_per_epoch=mini_batches,
        optimizer_steps_per_step=mini_batches * role.ppo_epochs,
        mini_batch_per_rank=per_rank,
        micro_batch_per_rank=None if role.dynamic_batching else micro,
        grad_accum_steps=None if role.dynamic_batching else per_rank // micro,
    )
