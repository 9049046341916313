"""The run configuration of a PPO/GRPO job: typed, frozen dataclasses, validated once at start.

::

    from trainer.config import derive_sizes, load_config

    config = load_config(CONFIG_DIR / "grpo.yaml", ["actor.lr=1e-5", "rollout.n=8"])
    sizes = derive_sizes(config)

1. :func:`load_config` merges the dataclass defaults, the YAML file and the ``key.sub=value`` overrides,
   in that order, and resolves ``${...}`` interpolations (:mod:`trainer.config.loading`).
2. The merged tree is converted onto the schema (:mod:`trainer.config.schema`; the sections that a
   component consumes are that component's own classes) and checked in ONE pass
   that collects every problem: unknown keys with a close-match suggestion, wrong types and values out of
   range (:mod:`trainer.config.convert`), then rules across values, registry names and files
   (:mod:`trainer.config.rules`) and sizes that must divide (:mod:`trainer.config.sizes`). A single
   :class:`ConfigError` lists them all, each under its full key.
3. Sizes that follow from the config come from :func:`derive_sizes`, and the values the workers take
   from outside their own sections (the schedule's span, the engine's length, the resolved loss) from
   :func:`derive_values`; neither is ever written back.

Every section is frozen (assignment raises ``dataclasses.FrozenInstanceError``); lists become tuples and
mappings become :class:`FrozenMap`. The YAML files shipped with the trainer sit in this folder
(:data:`CONFIG_DIR`). docs/config.md is the reference for every key.
"""

from pathlib import Path

from hybridflow.config_fields import FrozenMap
from trainer.config.loading import config_from_dict, config_to_dict, load_config
from trainer.config.problems import ConfigError
from trainer.config.recipe import recipe_field, recipe_settings
from trainer.config.schema import (
    GLOBAL_POOL,
    ROLES,
    ActorConfig,
    AlgorithmConfig,
    AsyncRolloutConfig,
    CriticConfig,
    DataConfig,
    KLControlConfig,
    ModelConfig,
    OptimizedRoleConfig,
    PoolConfig,
    RefConfig,
    ReshardingConfig,
    ResourceConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutConfig,
    RunConfig,
    ShapingSpec,
    TeacherConfig,
    TinyModelConfig,
    TrainerConfig,
    ValSamplingConfig,
)
from trainer.config.sizes import DerivedSizes, DerivedValues, UpdateSizes, derive_sizes, derive_values

CONFIG_DIR = Path(__file__).resolve().parent
"""Folder of the shipped YAML files (``grpo.yaml``, ``ppo.yaml``)."""

__all__ = [
    "CONFIG_DIR",
    "GLOBAL_POOL",
    "ROLES",
    "ActorConfig",
    "AlgorithmConfig",
    "AsyncRolloutConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "DerivedSizes",
    "DerivedValues",
    "FrozenMap",
    "KLControlConfig",
    "ModelConfig",
    "OptimizedRoleConfig",
    "PoolConfig",
    "RefConfig",
    "ReshardingConfig",
    "ResourceConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RunConfig",
    "ShapingSpec",
    "TeacherConfig",
    "TinyModelConfig",
    "TrainerConfig",
    "UpdateSizes",
    "ValSamplingConfig",
    "config_from_dict",
    "config_to_dict",
    "derive_sizes",
    "derive_values",
    "load_config",
    "recipe_field",
    "recipe_settings",
]
