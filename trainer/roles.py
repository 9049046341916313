"""From a `RunConfig` to running worker groups: pools, role settings, placement."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hybridflow.controller import (
    RayWorkerGroup,
    ResourcePool,
    RoleSpec,
    Worker,
    create_worker_groups,
    shutdown_worker_groups,
)
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rewards import RewardConfig as RewardManagerConfig
from hybridflow.rewards import ShapingSpec
from hybridflow.rollout.config import RolloutConfig as EngineConfig
from trainer.config import GLOBAL_POOL, DerivedSizes, OptimizedRoleConfig, RunConfig
from trainer.config.frozen import FrozenMap
from workers.actor import ActorRolloutRefWorker
from workers.config import ActorConfig, CriticConfig, ModelConfig, OptimConfig
from workers.config import RewardModelConfig as RewardModelWorkerConfig
from workers.critic import CriticWorker
from workers.reward_model import RewardModelWorker

__all__ = [
    "SHIPPED_WORKER_CLASSES",
    "actor_rollout_options",
    "actor_settings",
    "build_pools",
    "build_worker_groups",
    "critic_settings",
    "engine_settings",
    "load_worker_groups",
    "model_settings",
    "resharding_settings",
    "reward_model_settings",
    "reward_settings",
    "start_worker_groups",
    "worker_class",
]


def _optim(role: OptimizedRoleConfig, total_updates: int) -> OptimConfig:
    return OptimConfig(
        lr=role.lr,
        weight_decay=role.weight_decay,
        betas=tuple(role.betas),
        grad_clip=role.grad_clip or 0.0,
        schedule=role.lr_scheduler,
        warmup_steps=role.warmup_steps,
        total_steps=max(1, total_updates),
        min_lr_ratio=role.min_lr_ratio,
    )


def model_settings(config: RunConfig, role: OptimizedRoleConfig, model_dir: Path) -> ModelConfig:
    """The model a trained role (``config.actor`` or ``config.critic``) loads from ``model_dir``."""
    return ModelConfig(
        path=str(model_dir),
        dtype=config.model.dtype,
        activation_checkpointing=role.activation_checkpointing,
        param_dtype=role.param_dtype,
    )


def actor_settings(config: RunConfig, sizes: DerivedSizes, total_steps: int) -> ActorConfig:
    """The actor worker's settings; the LR schedule spans the optimizer steps of ``total_steps``."""
    actor = config.actor
    return ActorConfig(
        optim=_optim(actor, total_steps * sizes.actor.optimizer_steps_per_step),
        mini_batch_size=actor.ppo_mini_batch_size,
        micro_batch_size=actor.ppo_micro_batch_size,
        forward_micro_batch_size=actor.forward_micro_batch_size,
        max_tokens_per_micro_batch=actor.max_tokens_per_micro_batch if actor.dynamic_batching else None,
        ref_forward_micro_batch_size=config.ref.forward_micro_batch_size,
        ref_max_tokens_per_micro_batch=(
            config.ref.max_tokens_per_micro_batch if config.ref.dynamic_batching else None
        ),
        epochs=actor.ppo_epochs,
        shuffle=actor.shuffle,
        seed=config.data.seed,
        policy_loss=actor.policy_loss,
        policy_loss_params=actor.policy_loss_params(),
        loss_agg_mode=actor.loss_agg_mode,
        loss_norm_constant=float(config.data.max_response_length),
        entropy_coef=actor.entropy_coef,
        kl_loss_coef=actor.kl_loss_coef if actor.use_kl_loss else 0.0,
        kl_estimator=actor.kl_estimator,
        skip_zero_advantage_rows=actor.skip_zero_advantage_rows,
        rollout_correction=actor.rollout_correction,
        rollout_correction_cap=actor.rollout_correction_cap,
    )


def critic_settings(
    config: RunConfig, sizes: DerivedSizes, total_steps: int, model_dir: Path
) -> CriticConfig:
    """The critic worker's settings: a value head on the policy's own backbone."""
    critic = config.critic
    assert critic is not None and sizes.critic is not None
    return CriticConfig(
        model=model_settings(config, critic, model_dir),
        optim=_optim(critic, total_steps * sizes.critic.optimizer_steps_per_step),
        mini_batch_size=critic.ppo_mini_batch_size,
        micro_batch_size=critic.ppo_micro_batch_size,
        forward_micro_batch_size=critic.forward_micro_batch_size,
        max_tokens_per_micro_batch=critic.max_tokens_per_micro_batch if critic.dynamic_batching else None,
        epochs=critic.ppo_epochs,
        shuffle=critic.shuffle,
        seed=config.data.seed,
        cliprange_value=critic.cliprange_value,
        loss_agg_mode=critic.loss_agg_mode,
        loss_norm_constant=float(config.data.max_response_length),
    )


def reward_model_settings(config: RunConfig) -> RewardModelWorkerConfig:
    """The reward-model worker's settings. It re-tokenises from the ``raw_prompt`` and ``response_text``
    columns when ``reward_model.tokenizer`` is set."""
    reward_model = config.reward_model
    assert reward_model is not None and reward_model.path is not None
    return RewardModelWorkerConfig(
        model=ModelConfig(
            path=reward_model.path, dtype=config.model.dtype, param_dtype=reward_model.param_dtype
        ),
        micro_batch_size=reward_model.forward_micro_batch_size,
        max_tokens_per_micro_batch=(
            reward_model.max_tokens_per_micro_batch if reward_model.dynamic_batching else None
        ),
        tokenizer_path=reward_model.tokenizer,
        prompt_column="raw_prompt",
        response_column="response_text",
    )


def engine_settings(config: RunConfig) -> EngineConfig:
    rollout = config.rollout
    return EngineConfig(
        name=rollout.engine,
        tensor_parallel_size=rollout.tp_size,
        dtype=rollout.dtype or config.model.dtype,
        seed=rollout.seed,
        max_model_len=config.data.max_prompt_length + config.data.max_response_length,
        kv_cache_memory_bytes=rollout.kv_cache_bytes,
        max_num_seqs=rollout.max_num_seqs,
        max_num_batched_tokens=rollout.max_num_batched_tokens,
        enforce_eager=rollout.enforce_eager,
        cache_dir=rollout.cache_dir,
    )


def reward_settings(config: RunConfig) -> RewardManagerConfig:
    reward = config.reward
    return RewardManagerConfig(
        num_workers=reward.num_workers,
        timeout_s=reward.timeout_s,
        fallback_score=reward.fallback_score,
        default_fn=reward.default_fn,
        fn_by_source=dict(reward.fn_by_source),
        shaping=tuple(ShapingSpec(s.name, dict(s.kwargs)) for s in reward.shaping),
        kill_grace_s=reward.kill_grace_s,
        abort_failure_rate=reward.abort_failure_rate,
        abort_window=reward.abort_window,
    )


def resharding_settings(config: RunConfig) -> ReshardingConfig:
    """How the actor's weights switch layout: the gather buffer, the actor's offload choices, the KV cache."""
    return ReshardingConfig(
        bucket_bytes=config.resharding.bucket_bytes,
        offload_optimizer=config.actor.optimizer_offload,
        offload_params=config.actor.param_offload,
        free_kv_cache=config.resharding.free_kv_cache,
    )


def actor_rollout_options(config: RunConfig) -> dict[str, bool]:
    """Keyword arguments of the actor/rollout worker: whether it holds the reference policy, and whether
    that copy waits in host memory between uses."""
    return {"with_ref": config.needs_reference, "offload_ref": config.ref.param_offload}


def build_pools(config: RunConfig) -> dict[str, ResourcePool]:
    """The global pool and every extra pool of ``resource.pools``."""
    resource = config.resource

    def pool(name: str, nodes: int, slots: int) -> ResourcePool:
        return ResourcePool(
            [slots] * nodes, use_gpu=resource.use_gpu, cpus_per_slot=resource.cpus_per_slot, name=name
        )

    pools = {GLOBAL_POOL: pool(GLOBAL_POOL, resource.nodes, resource.slots_per_node)}
    for name, extra in resource.pools.items():
        pools[name] = pool(name, extra.nodes, extra.slots_per_node)
    return pools


SHIPPED_WORKER_CLASSES: dict[str, type[Worker]] = {
    "actor_rollout": ActorRolloutRefWorker,
    "critic": CriticWorker,
    "reward_model": RewardModelWorker,
}
"""The class each role runs unless a recipe supplies a subclass (`build_worker_groups`)."""


def worker_class(role: str, worker_classes: Mapping[str, type[Worker]]) -> type[Worker]:
    """The class to run for ``role``: the recipe's, which must subclass the shipped one, or the shipped one.

    Raises:
        ValueError: for an unknown role name or a class that does not subclass the shipped class.
    """
    unknown = sorted(set(worker_classes) - set(SHIPPED_WORKER_CLASSES))
    if unknown:
        raise ValueError(f"worker_classes: unknown role(s) {unknown}; roles are {sorted(SHIPPED_WORKER_CLASSES)}")
    shipped = SHIPPED_WORKER_CLASSES[role]
    cls = worker_classes.get(role, shipped)
    if not (isinstance(cls, type) and issubclass(cls, shipped)):
        raise ValueError(
            f"worker_classes[{role!r}]: {cls!r} must be a subclass of {shipped.__module__}.{shipped.__name__}"
        )
    return cls


def build_worker_groups(
    config: RunConfig,
    sizes: DerivedSizes,
    total_steps: int,
    model_dir: Path,
    pools: dict[str, ResourcePool],
    worker_classes: Mapping[str, type[Worker]] = FrozenMap(),
) -> dict[str, RayWorkerGroup]:
    """Start the roles the run needs on their pools (colocated where they share one) and load them:
    `start_worker_groups`, then `load_worker_groups`."""
    groups = start_worker_groups(config, sizes, total_steps, model_dir, pools, worker_classes)
    load_worker_groups(groups)
    return groups


def start_worker_groups(
    config: RunConfig,
    sizes: DerivedSizes,
    total_steps: int,
    model_dir: Path,
    pools: dict[str, ResourcePool],
    worker_classes: Mapping[str, type[Worker]] = FrozenMap(),
) -> dict[str, RayWorkerGroup]:
    """Start the processes of the roles the run needs on their pools (colocated where they share one)
    and construct the roles in them, without loading any model (`load_worker_groups` does).

    ``worker_classes`` maps a role to a recipe's subclass of its shipped class (`worker_class`), built
    with the same arguments. Roles on the same pool share one process per slot; a role on another pool
    gets processes of its own. If any start fails, every process started here is stopped before the
    error propagates (the pools' placement groups stay: they belong to the caller).
    """
    model = model_settings(config, config.actor, model_dir)
    roles = {
        "actor_rollout": RoleSpec(
            worker_class("actor_rollout", worker_classes),
            (model, actor_settings(config, sizes, total_steps), engine_settings(config), resharding_settings(config)),
            actor_rollout_options(config),
        )
    }
    if config.critic is not None:
        roles["critic"] = RoleSpec(
            worker_class("critic", worker_classes), (critic_settings(config, sizes, total_steps, model_dir),)
        )
    if config.reward_model is not None:
        roles["reward_model"] = RoleSpec(worker_class("reward_model", worker_classes), (reward_model_settings(config),))
    unused = sorted(set(worker_classes) - set(roles))
    if unused:
        raise ValueError(f"worker_classes names role(s) {unused} that this run does not start")
    placement = {role: pools[config.resource.pool_of(role)] for role in roles}
    return create_worker_groups(roles, placement)


def load_worker_groups(groups: Mapping[str, RayWorkerGroup]) -> dict[str, list[dict[str, float]]]:
    """``init_model`` on every group, one after the other; returns each role's per-rank reports (the
    actor's ``init/load_s`` and ``init/engine_s``). If any load fails, every process of ``groups`` is
    stopped before the error propagates."""
    try:
        return {role: group.init_model() for role, group in groups.items()}
    except BaseException:
        shutdown_worker_groups(groups.values(), "the trainer failed to load its worker groups")
        raise
