"""From a `RunConfig` to running worker groups: pools, placement, and each role started on its own
config sections plus the values derived for it (`trainer.config.derive_values`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from hybridflow.config_fields import FrozenMap
from hybridflow.controller import (
    RayWorkerGroup,
    ResourcePool,
    RoleSpec,
    Worker,
    create_worker_groups,
    shutdown_worker_groups,
)
from trainer.config import GLOBAL_POOL, DerivedSizes, RunConfig, derive_values
from workers.actor import ActorRolloutRefWorker
from workers.critic import CriticWorker
from workers.reward_model import RewardModelWorker
from workers.rollout import RolloutWorker
from workers.teacher import TeacherWorker

__all__ = [
    "SHIPPED_WORKER_CLASSES",
    "build_pools",
    "build_worker_groups",
    "load_worker_groups",
    "role_specs",
    "start_worker_groups",
    "worker_class",
]


def build_pools(config: RunConfig) -> dict[str, ResourcePool]:
    """The global pool and every extra pool of ``resource.pools``."""
    resource = config.resource

    def pool(name: str, nodes: int, slots: int, custom: Mapping[str, float]) -> ResourcePool:
        return ResourcePool(
            [slots] * nodes,
            use_gpu=resource.use_gpu,
            cpus_per_slot=resource.cpus_per_slot,
            name=name,
            custom_resources=custom,
        )

    pools = {GLOBAL_POOL: pool(GLOBAL_POOL, resource.nodes, resource.slots_per_node, resource.custom_resources)}
    for name, extra in resource.pools.items():
        pools[name] = pool(name, extra.nodes, extra.slots_per_node, extra.custom_resources)
    return pools


SHIPPED_WORKER_CLASSES: dict[str, type[Worker]] = {
    "actor_rollout": ActorRolloutRefWorker,
    "critic": CriticWorker,
    "reward_model": RewardModelWorker,
    "teacher": TeacherWorker,
    "rollout": RolloutWorker,
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


def role_specs(
    config: RunConfig,
    sizes: DerivedSizes,
    total_steps: int,
    model_dir: Path,
    worker_classes: Mapping[str, type[Worker]] = FrozenMap(),
) -> dict[str, RoleSpec]:
    """How each role the run needs is constructed: its class (`worker_class`), its config sections and
    the values derived for it. The actor/rollout worker takes ``actor``, ``ref``, ``rollout``,
    ``resharding`` and `ActorDerived`; the critic ``critic`` and `CriticDerived`; the reward model
    ``reward_model`` and ``model.dtype``; the teacher ``teacher`` and ``model.dtype``."""
    values = derive_values(config, sizes, total_steps, model_dir)
    roles = {
        "actor_rollout": RoleSpec(
            worker_class("actor_rollout", worker_classes),
            (config.actor, config.ref, config.rollout, config.resharding, values.actor),
        )
    }
    if config.resource.splits_rollout:
        roles["rollout"] = RoleSpec(
            worker_class("rollout", worker_classes), (config.rollout, str(model_dir), values.actor.engine)
        )
    if config.critic is not None and values.critic is not None:
        roles["critic"] = RoleSpec(worker_class("critic", worker_classes), (config.critic, values.critic))
    if config.reward_model is not None:
        roles["reward_model"] = RoleSpec(
            worker_class("reward_model", worker_classes), (config.reward_model, config.model.dtype)
        )
    if config.teacher is not None:
        roles["teacher"] = RoleSpec(worker_class("teacher", worker_classes), (config.teacher, config.model.dtype))
    return roles


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
    roles = role_specs(config, sizes, total_steps, model_dir, worker_classes)
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
