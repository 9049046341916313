"""The schema of a run config: `RunConfig`, one frozen dataclass per section, defaults and bounds
beside each field.

The sections a component consumes are that component's own classes, defined where it lives (``rollout``:
``hybridflow.rollout``; ``actor``, ``critic``, ``ref``, ``reward_model``, ``teacher``: ``workers.config``;
``reward``: ``hybridflow.rewards``; ``resharding``: ``hybridflow.resharding``; ``monitor``:
``hybridflow.metrics.monitor``; ``agent``: ``hybridflow.agents``). The sections the trainer itself reads are defined here. docs/config.md
describes every key. Batch sizes count rows (responses) unless named after prompts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridflow.agents.config import AgentConfig
from hybridflow.algos import ADVANTAGE_ESTIMATORS
from hybridflow.config_fields import Dtype, FrozenMap, config_field
from hybridflow.metrics.efficiency import DEFAULT_PEAK_FILE
from hybridflow.metrics.monitor import MonitorConfig
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rewards.config import RewardConfig, ShapingSpec
from hybridflow.rollout.config import RolloutConfig, ValSamplingConfig
from workers.config import (
    ActorConfig,
    CriticConfig,
    OptimizedRoleConfig,
    RefConfig,
    RewardModelConfig,
    TeacherConfig,
)

__all__ = [
    "GLOBAL_POOL",
    "ROLES",
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "AsyncRolloutConfig",
    "CriticConfig",
    "DataConfig",
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
    "ValSamplingConfig",
]

ROLES = ("actor_rollout", "critic", "reward_model", "teacher", "rollout")
"""Worker roles that ``resource.placement`` can map to a resource pool.

``rollout`` is the inference engine: unplaced, or placed on the actor's pool, it lives in the actor's
processes (the colocated hybrid engine); placed on another pool, it runs there in processes of its own
and takes its weights over a weight group (docs/rollout_service.md).

The reference policy lives in the ``actor_rollout`` processes and the rule-based reward functions in the
controller's own process pool, so neither can be placed.
"""

GLOBAL_POOL = "global"
"""Name of the default pool, sized by ``resource.nodes`` and ``resource.slots_per_node``."""

LoggerName = Literal["console", "jsonl", "tensorboard", "wandb"]


@dataclass(frozen=True)
class TinyModelConfig:
    """A randomly initialised Qwen2 built by ``hybridflow.models.build_tiny_causal_lm`` (``model.path`` unset).

    ``vocab_size`` null means the tokenizer's vocabulary size.
    """

    vocab_size: int | None = config_field(None, ge=1)
    hidden_size: int = config_field(64, ge=1)
    num_layers: int = config_field(2, ge=1)
    num_heads: int = config_field(2, ge=1)
    num_kv_heads: int = config_field(2, ge=1)
    intermediate_size: int = config_field(128, ge=1)
    max_position_embeddings: int = config_field(1024, ge=1)
    initializer_range: float = config_field(0.02, gt=0)
    seed: int = config_field(0, ge=0)


@dataclass(frozen=True)
class ModelConfig:
    """The policy model: a Hugging Face directory (``path``) or, when ``path`` is null, the ``tiny`` builder.

    ``tokenizer`` null means the model directory's tokenizer, or the character tokenizer for a tiny model.
    """

    path: str | None = None
    tokenizer: str | None = None
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    dtype: Dtype = "float32"


@dataclass(frozen=True)
class DataConfig:
    """Prompt datasets (parquet or jsonl in the veRL row layout) and how they are batched.

    ``train_batch_size`` and ``val_batch_size`` count prompts; each prompt yields ``rollout.n`` rows.
    """

    train_files: tuple[str, ...] = ()
    val_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    max_prompt_length: int = config_field(512, ge=1)
    max_response_length: int = config_field(512, ge=1)
    train_batch_size: int = config_field(64, ge=1)
    val_batch_size: int = config_field(64, ge=1)
    shuffle: bool = True
    seed: int = config_field(0, ge=0)


@dataclass(frozen=True)
class KLControlConfig:
    """The in-reward KL coefficient: ``fixed`` at ``kl_coef``, or ``adaptive`` towards ``target_kl``."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = config_field(0.001, ge=0)
    target_kl: float = config_field(0.1, gt=0)
    horizon: float = config_field(10000.0, gt=0)


@dataclass(frozen=True)
class AlgorithmConfig:
    """The advantage estimator and the KL penalty folded into the reward.

    ``gamma``, ``lam`` and ``norm_by_std`` are passed to the estimator when it takes them (see
    :meth:`advantage_params`), and ``estimator_kwargs`` passes any other keyword argument of it (e.g.
    ``k`` of ``pass_at_k``). ``kl_penalty`` names the KL estimator of the in-reward penalty.
    """

    adv_estimator: str = "grpo"
    gamma: float = config_field(1.0, ge=0, le=1)
    lam: float = config_field(1.0, ge=0, le=1)
    norm_by_std: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "k1"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    estimator_kwargs: Mapping[str, Any] = field(default_factory=FrozenMap)

    def advantage_params(self) -> dict[str, Any]:
        """The estimator parameters that the chosen estimator accepts, then ``estimator_kwargs``, as its
        keyword arguments."""
        offered = {"gamma": self.gamma, "lam": self.lam, "norm_by_std": self.norm_by_std}
        accepted = _accepted_params(ADVANTAGE_ESTIMATORS.get(self.adv_estimator), offered, skip_positional=1)
        return {**accepted, **self.estimator_kwargs}


@dataclass(frozen=True)
class PoolConfig:
    """An extra resource pool for split placement. ``custom_resources``: custom Ray resources each slot
    reserves (``{rollout_node: 1}``): only nodes started with them (``ray start --resources``) hold the pool."""

    nodes: int = config_field(1, ge=1)
    slots_per_node: int = config_field(1, ge=1)
    custom_resources: Mapping[str, float] = field(default_factory=FrozenMap)


@dataclass(frozen=True)
class ResourceConfig:
    """Device slots and which role runs where.

    The ``global`` pool has ``nodes * slots_per_node`` slots. Roles not named in ``placement`` run on it,
    colocated in one process per slot; mapping a role to a pool from ``pools`` splits it off into
    processes of its own. ``custom_resources``: custom Ray resources each slot of the ``global`` pool
    reserves, as for `PoolConfig`.
    """

    nodes: int = config_field(1, ge=1)
    slots_per_node: int = config_field(2, ge=1)
    use_gpu: bool = False
    cpus_per_slot: float = config_field(1.0, gt=0)
    custom_resources: Mapping[str, float] = field(default_factory=FrozenMap)
    pools: Mapping[str, PoolConfig] = field(default_factory=FrozenMap)
    placement: Mapping[str, str] = field(default_factory=FrozenMap)

    def pool_of(self, role: str) -> str:
        """Name of the pool that ``role`` runs on; the rollout's default is the actor's pool."""
        if role == "rollout" and role not in self.placement:
            return self.pool_of("actor_rollout")
        return self.placement.get(role, GLOBAL_POOL)

    @property
    def splits_rollout(self) -> bool:
        """Whether the rollout engines run on a pool of their own, apart from the actor."""
        return self.pool_of("rollout") != self.pool_of("actor_rollout")

    def world_size_of(self, role: str) -> int:
        """Number of ranks (slots) of the pool that ``role`` runs on."""
        pool = self.pool_of(role)
        if pool == GLOBAL_POOL:
            return self.nodes * self.slots_per_node
        return self.pools[pool].nodes * self.pools[pool].slots_per_node


@dataclass(frozen=True)
class AsyncRolloutConfig:
    """Generation ahead of the trainer, on a rollout pool of its own (docs/rollout_service.md).

    ``max_staleness`` bounds the gap, in policy versions, between the trainer and the oldest token it
    trains on: at most that many prompt batches are admitted to the rollout pool ahead of the trainer's
    step. 0 is synchronous; 1 generates the next batch while this one trains (one-step-off-policy).

    ``partial_round_tokens`` > 0 turns on partial rollouts (colocated, or streamed on a rollout pool of
    its own): generation runs in rounds of at most that many new tokens per sample; a step trains the
    ``data.train_batch_size`` oldest prompts whose samples have all finished, and samples still running
    pause and go on in later steps on newer weights, each token keeping its own version
    (``token_versions``). ``max_staleness`` then bounds every token: a prompt started ``max_staleness``
    versions ago runs its samples to the end in that step. 0 is off.
    """

    max_staleness: int = config_field(0, ge=0)
    partial_round_tokens: int = config_field(0, ge=0)


@dataclass(frozen=True)
class TrainerConfig:
    """The run: its length, validation, checkpoints, logging and output folder.

    ``total_steps`` (when set) overrides ``total_epochs``. ``val_every``/``save_every`` 0 means never.
    ``resume`` is ``auto`` (latest checkpoint in ``checkpoint_dir`` if any), ``disable`` or a checkpoint
    path. ``existing_output`` is what a fresh start does in an output folder that holds another run's
    metrics or checkpoints: ``refuse`` (stop before anything starts, saying what the folder holds),
    ``archive`` (move them into a dated subfolder) or ``delete`` (`trainer.run_folder`). ``console``: ``quiet`` sends the engine's and Ray's output to ``<output_dir>/logs`` and keeps
    the console to the progress bar, the metric lines and real warnings
    (`hybridflow.metrics.log_routing`); ``verbose`` leaves every process's output on the console.
    ``machine_peak_file`` holds the machine's measured peaks (``python benchmarks/bench_machine_peak.py``);
    with an entry for the run's device, every step reports each phase's fraction of it (``perf/mfu_*``).
    ``rollout_dump`` writes the rows each step trained on (prompt index, length, version, score, text) to
    ``<output_dir>/rollouts/step_<k>.jsonl`` (`hybridflow.metrics.rollout_dump`).
    """

    total_epochs: int = config_field(1, ge=1)
    total_steps: int | None = config_field(None, ge=1)
    val_every: int = config_field(0, ge=0)
    val_before_train: bool = True
    save_every: int = config_field(0, ge=0)
    checkpoint_dir: str = "${trainer.output_dir}/checkpoints"
    resume: str = "auto"
    existing_output: Literal["refuse", "archive", "delete"] = "refuse"
    loggers: tuple[LoggerName, ...] = ("console", "jsonl")
    project: str = "hybridflow"
    experiment: str = "default"
    output_dir: str = "outputs/${trainer.project}/${trainer.experiment}"
    wandb_mode: Literal["online", "offline", "disabled"] = "offline"
    console: Literal["quiet", "verbose"] = "quiet"
    machine_peak_file: str = DEFAULT_PEAK_FILE
    rollout_dump: bool = False


@dataclass(frozen=True)
class RunConfig:
    """The whole run. ``critic`` null means no critic (required when the estimator is ``gae``);
    ``reward_model`` null means no reward model (the reward functions alone score); ``teacher`` null
    means no teacher (set, a frozen model of its own path scores the sampled tokens: docs/distillation.md).
    ``agent`` null means single-turn rollouts; set, each prompt starts multi-turn episodes
    (docs/agents.md). ``recipe`` holds a recipe's own settings, read and checked by the recipe
    (`trainer.config.recipe_settings`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    async_rollout: AsyncRolloutConfig = field(default_factory=AsyncRolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    critic: CriticConfig | None = None
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig | None = None
    teacher: TeacherConfig | None = None
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    resource: ResourceConfig = field(default_factory=ResourceConfig)
    resharding: ReshardingConfig = field(default_factory=ReshardingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    recipe: Mapping[str, Any] = field(default_factory=FrozenMap)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    agent: AgentConfig | None = None

    @property
    def needs_reference(self) -> bool:
        """Whether the run needs reference-policy log-probs."""
        return self.actor.use_kl_loss or self.algorithm.use_kl_in_reward


def _accepted_params(
    fn: Callable[..., Any], offered: Mapping[str, Any], skip_positional: int
) -> dict[str, Any]:
    """The entries of ``offered`` that ``fn`` takes by keyword (all of them if it takes ``**kwargs``)."""
    parameters = list(inspect.signature(fn).parameters.values())[skip_positional:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(offered)
    names = {p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL}
    return {key: value for key, value in offered.items() if key in names}
