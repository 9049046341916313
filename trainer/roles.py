"""From a `RunConfig` to running worker groups: pools, role settings, placement."""

from __future__ import annotations

from pathlib import Path

from hybridflow.controller import (
    RayWorkerGroup,
    ResourcePool,
    RoleSpec,
    create_worker_groups,
    shutdown_worker_groups,
)
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rewards import RewardConfig as RewardManagerConfig
from hybridflow.rewards import ShapingSpec
from hybridflow.rollout.config import RolloutConfig as EngineConfig
from trainer.config import GLOBAL_POOL, DerivedSizes, OptimizedRoleConfig, RunConfig
from workers.actor import ActorRolloutRefWorker
from workers.config import ActorConfig, CriticConfig, ModelConfig, OptimConfig
from workers.config import RewardModelConfig as RewardModelWorkerConfig
from workers.critic import CriticWorker
from workers.reward_model import RewardModelWorker

__all__ = [
    "actor_settings",
    "build_pools",
    "build_worker_groups",
    "critic_settings",
    "engine_settings",
    "reward_model_settings",
    "reward_settings",
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


def _model(config: RunConfig, role: OptimizedRoleConfig, model_dir: Path) -> ModelConfig:
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
    )


def critic_settings(
    config: RunConfig, sizes: DerivedSizes, total_steps: int, model_dir: Path
) -> CriticConfig:
    """The critic worker's settings: a value head on the policy's own backbone."""
    critic = config.critic
    assert critic is not None and sizes.critic is not None
    return CriticConfig(
        model=_model(config, critic, model_dir),
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
        dtype=config.model.dtype,
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


def build_worker_groups(
    config: RunConfig, sizes: DerivedSizes, total_steps: int, model_dir: Path, pools: dict[str, ResourcePool]
) -> dict[str, RayWorkerGroup]:
    """Start the roles the run needs on their pools (colocated where they share one) and load them.

    Roles on the same pool share one process per slot; a role on another pool gets processes of its own.
    If any start or load fails, every process started here is stopped before the error propagates (the
    pools' placement groups stay: they belong to the caller).
    """
    model = _model(config, config.actor, model_dir)
    resharding = ReshardingConfig(
        bucket_bytes=config.resharding.bucket_bytes,
        offload_optimizer=config.actor.optimizer_offload,
        offload_params=config.actor.param_offload,
    )
    roles = {
        "actor_rollout": RoleSpec(
            ActorRolloutRefWorker,
            (model, actor_settings(config, sizes, total_steps), engine_settings(config), resharding),
            {"with_ref": config.needs_reference, "offload_ref": config.ref.param_offload},
        )
    }
    if config.critic is not None:
        roles["critic"] = RoleSpec(CriticWorker, (critic_settings(config, sizes, total_steps, model_dir),))
    if config.reward_model is not None:
        roles["reward_model"] = RoleSpec(RewardModelWorker, (reward_model_settings(config),))
    placement = {role: pools[config.resource.pool_of(role)] for role in roles}
    # Stops what it started if a role fails to start; loading is this function's to clean up.
    groups = create_worker_groups(roles, placement)
    try:
        for group in groups.values():
            group.init_model()
    except BaseException:
        shutdown_worker_groups(groups.values(), "the trainer failed to load its worker groups")
        raise
    return groups
