"""The schema of a run config: one frozen dataclass per section, defaults and bounds beside each field.

docs/config.md describes every key. Batch sizes count rows (responses) unless named after prompts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

from hybridflow.algos import ADVANTAGE_ESTIMATORS
from hybridflow.metrics.monitor import MonitorConfig
from hybridflow.resharding.manager import ReshardingConfig as _Resharding
from hybridflow.rewards.config import RewardConfig as _RewardManager
from hybridflow.rollout.config import RolloutConfig as _Engine
from trainer.config.frozen import FrozenMap
from workers.config import ActorConfig as _Actor
from workers.config import CriticConfig as _Critic
from workers.config import ModelConfig as _Model
from workers.config import OptimConfig as _Optim
from workers.config import RewardModelConfig as _RewardModel

__all__ = [
    "GLOBAL_POOL",
    "ROLES",
    "ActorConfig",
    "AlgorithmConfig",
    "CriticConfig",
    "DataConfig",
    "KLControlConfig",
    "ModelConfig",
    "OptimizedRoleConfig",
    "PoolConfig",
    "RefConfig",
    "ResharderConfig",
    "ResourceConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RunConfig",
    "ShapingConfig",
    "TinyModelConfig",
    "TrainerConfig",
    "ValSamplingConfig",
]

ROLES = ("actor_rollout", "critic", "reward_model")
"""Worker roles that ``resource.placement`` can map to a resource pool.

The reference policy lives in the ``actor_rollout`` processes and the rule-based reward functions in the
controller's own process pool, so neither can be placed.
"""

GLOBAL_POOL = "global"
"""Name of the default pool, sized by ``resource.nodes`` and ``resource.slots_per_node``."""

Dtype = Literal["float32", "bfloat16", "float16"]
LoggerName = Literal["console", "jsonl", "tensorboard", "wandb"]


def _field(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None) -> Any:
    """A dataclass field whose numeric bounds are declared next to its default and checked on load."""
    bounds = {name: limit for name, limit in (("ge", ge), ("gt", gt), ("le", le)) if limit is not None}
    return field(default=default, metadata={"bounds": bounds})


def _default_of(component: type, name: str) -> Any:
    """The component class's own default for its field ``name``: the one place that setting's default is
    defined (docs/config.md, "Where defaults live")."""
    default = component.__dataclass_fields__[name].default
    if default is MISSING:
        raise TypeError(f"{component.__name__}.{name} has no default to take")
    return default


def _from(component: type, name: str, **bounds: float) -> Any:
    """A field with the component's default for ``name`` (`_default_of`) and numeric ``bounds``."""
    return _field(_default_of(component, name), **bounds)


@dataclass(frozen=True)
class TinyModelConfig:
    """A randomly initialised Qwen2 built by ``hybridflow.models.build_tiny_causal_lm`` (``model.path`` unset).

    ``vocab_size`` null means the tokenizer's vocabulary size.
    """

    vocab_size: int | None = _field(None, ge=1)
    hidden_size: int = _field(64, ge=1)
    num_layers: int = _field(2, ge=1)
    num_heads: int = _field(2, ge=1)
    num_kv_heads: int = _field(2, ge=1)
    intermediate_size: int = _field(128, ge=1)
    max_position_embeddings: int = _field(1024, ge=1)
    initializer_range: float = _field(0.02, gt=0)
    seed: int = _field(0, ge=0)


@dataclass(frozen=True)
class ModelConfig:
    """The policy model: a Hugging Face directory (``path``) or, when ``path`` is null, the ``tiny`` builder.

    ``tokenizer`` null means the model directory's tokenizer, or the character tokenizer for a tiny model.
    """

    path: str | None = None
    tokenizer: str | None = None
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    dtype: Dtype = field(default=_default_of(_Model, "dtype"))


@dataclass(frozen=True)
class DataConfig:
    """Prompt datasets (parquet or jsonl in the veRL row layout) and how they are batched.

    ``train_batch_size`` and ``val_batch_size`` count prompts; each prompt yields ``rollout.n`` rows.
    """

    train_files: tuple[str, ...] = ()
    val_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    max_prompt_length: int = _field(512, ge=1)
    max_response_length: int = _field(512, ge=1)
    train_batch_size: int = _field(64, ge=1)
    val_batch_size: int = _field(64, ge=1)
    shuffle: bool = True
    seed: int = _field(0, ge=0)


@dataclass(frozen=True)
class ValSamplingConfig:
    """Sampling for validation; the default is one greedy sample per prompt. ``top_k`` -1 disables top-k."""

    n: int = _field(1, ge=1)
    temperature: float = _field(0.0, ge=0)
    top_p: float = _field(1.0, gt=0, le=1)
    top_k: int = _field(-1, ge=-1)


@dataclass(frozen=True)
class RolloutConfig:
    """The generation engine and how it samples during training.

    ``tp_size`` consecutive ranks of the actor pool form one engine; the ``world / tp_size`` engines are
    the inference data-parallel groups, and dp group ``d`` samples with seed ``seed + d``.
    ``kv_cache_bytes`` is per rank and always bounded (unbounded, the CPU build of vLLM takes most of
    the host's memory). ``top_k`` -1 disables top-k. ``n`` is at least 2 for the group-relative
    estimators (``grpo``, ``rloo``, ``reinforce_pp_baseline``), hence the default of 8. ``dtype`` is
    the engine's weights and compute dtype; null is ``model.dtype`` (the actor's master weights).
    """

    engine: Literal["vllm", "hf"] = _from(_Engine, "name")
    dtype: Dtype | None = None
    n: int = _field(8, ge=1)
    temperature: float = _field(1.0, ge=0)
    top_p: float = _field(1.0, gt=0, le=1)
    top_k: int = _field(-1, ge=-1)
    tp_size: int = _from(_Engine, "tensor_parallel_size", ge=1)
    kv_cache_bytes: int = _from(_Engine, "kv_cache_memory_bytes", ge=1)
    max_num_seqs: int = _from(_Engine, "max_num_seqs", ge=1)
    max_num_batched_tokens: int | None = _from(_Engine, "max_num_batched_tokens", ge=1)
    enforce_eager: bool = _from(_Engine, "enforce_eager")
    cache_dir: str | None = _from(_Engine, "cache_dir")
    seed: int = _from(_Engine, "seed", ge=0)
    val_sampling: ValSamplingConfig = field(default_factory=ValSamplingConfig)


@dataclass(frozen=True)
class OptimizedRoleConfig:
    """Settings shared by the roles that train (actor, critic): optimizer, batching, precision.

    Batch sizes count rows (responses), not prompts: ``ppo_mini_batch_size`` rows across all ranks make
    one optimizer step; ``ppo_micro_batch_size`` rows on one rank make one forward/backward. With
    ``dynamic_batching`` the micro-batches are instead packed up to ``max_tokens_per_micro_batch``
    tokens per rank. ``forward_micro_batch_size`` is the per-rank row count of no-grad forwards
    (log-probs, values). ``grad_clip`` null disables clipping. ``param_dtype`` null is the device's
    default compute dtype (bf16 on GPU, fp32 on CPU; `hybridflow.parallel.DevicePlan`).
    """

    lr: float = _from(_Optim, "lr", gt=0)
    lr_scheduler: Literal["constant", "cosine", "linear"] = _from(_Optim, "schedule")
    warmup_steps: int = _from(_Optim, "warmup_steps", ge=0)
    min_lr_ratio: float = _from(_Optim, "min_lr_ratio", ge=0, le=1)
    weight_decay: float = _from(_Optim, "weight_decay", ge=0)
    betas: tuple[float, ...] = _from(_Optim, "betas")
    grad_clip: float | None = _from(_Optim, "grad_clip", gt=0)
    ppo_mini_batch_size: int = _from(_Actor, "mini_batch_size", ge=1)
    ppo_micro_batch_size: int = _from(_Actor, "micro_batch_size", ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = _field(8192, ge=1)
    forward_micro_batch_size: int = _from(_Actor, "forward_micro_batch_size", ge=1)
    ppo_epochs: int = _from(_Actor, "epochs", ge=1)
    shuffle: bool = _from(_Actor, "shuffle")
    param_dtype: Dtype | None = field(default=_default_of(_Model, "param_dtype"))
    activation_checkpointing: bool = _from(_Model, "activation_checkpointing")


@dataclass(frozen=True)
class ActorConfig(OptimizedRoleConfig):
    """The policy update. Names are checked against the ``hybridflow.algos`` registries.

    ``clip_eps_low``/``clip_eps_high`` bound the ratio to ``[1 - low, 1 + high]``; ``dual_clip_c``
    (> 1) caps the loss of negative-advantage tokens. Null leaves each at the chosen loss's own default
    (``ppo_clip`` 0.2, ``gspo`` 3e-4/4e-4, ``gmpo`` 0.4, ...; docs/algorithms.md); a value is passed
    only to a loss that takes it. ``kl_estimator`` and ``kl_loss_coef``
    apply when ``use_kl_loss`` is true. ``policy_loss_kwargs`` passes any other keyword argument of the
    chosen policy loss (e.g. ``tau_neg`` of ``sapo``), and overrides the three clip keys for it.
    ``skip_zero_advantage_rows`` leaves rows with zero advantage at every token out of the update
    (``auto``: where the gradient is provably unchanged; ``true`` is refused with a KL loss, an entropy
    bonus or a covariance-based loss). ``rollout_correction`` (``token``, ``sequence``) weights the
    policy loss by truncated importance weights, capped at ``rollout_correction_cap``, of the trainer's
    log-probs against the engine's. ``param_offload``/``optimizer_offload`` move the parameter shards and
    the optimizer state to host memory while the engine generates.
    """

    param_offload: bool = _from(_Resharding, "offload_params")
    optimizer_offload: bool = _from(_Resharding, "offload_optimizer")
    policy_loss: str = _from(_Actor, "policy_loss")
    clip_eps_low: float | None = _field(None, ge=0)
    clip_eps_high: float | None = _field(None, ge=0)
    dual_clip_c: float | None = _field(None, gt=1)
    loss_agg_mode: str = _from(_Actor, "loss_agg_mode")
    entropy_coef: float = _from(_Actor, "entropy_coef", ge=0)
    use_kl_loss: bool = False
    kl_loss_coef: float = _field(0.001, ge=0)
    kl_estimator: str = _from(_Actor, "kl_estimator")
    policy_loss_kwargs: Mapping[str, Any] = field(default_factory=FrozenMap)
    skip_zero_advantage_rows: Literal["auto", True, False] = "auto"
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    rollout_correction_cap: float = _field(2.0, gt=0)

    def policy_loss_params(self) -> dict[str, Any]:
        """The clip settings this config sets (not null), then ``policy_loss_kwargs``, as the policy
        loss's keyword arguments: every one left out keeps the loss's own default. The rules refuse a
        set clip key that the chosen loss does not take."""
        given = {
            "clip_eps_low": self.clip_eps_low,
            "clip_eps_high": self.clip_eps_high,
            "dual_clip_c": self.dual_clip_c,
        }
        return {**{key: value for key, value in given.items() if value is not None}, **self.policy_loss_kwargs}


@dataclass(frozen=True)
class CriticConfig(OptimizedRoleConfig):
    """The value model (required by the ``gae`` estimator). ``cliprange_value`` null disables clipping.

    Its learning rate defaults higher than the actor's (a freshly initialised value head); that default is
    the critic's own, defined here.
    """

    lr: float = _field(1e-5, gt=0)
    cliprange_value: float | None = _from(_Critic, "cliprange_value", gt=0)
    loss_agg_mode: str = _from(_Critic, "loss_agg_mode")


@dataclass(frozen=True)
class RefConfig:
    """The frozen reference policy, used when ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``."""

    forward_micro_batch_size: int = _from(_Actor, "ref_forward_micro_batch_size", ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = _field(8192, ge=1)
    param_offload: bool = False


@dataclass(frozen=True)
class ShapingConfig:
    """One reward-shaping step: a registered shaping name and its keyword arguments."""

    name: str = ""
    kwargs: Mapping[str, Any] = field(default_factory=FrozenMap)


@dataclass(frozen=True)
class RewardConfig:
    """How samples are scored.

    A reward function is a registered name (e.g. ``exact_match``) or ``path/to/file.py:function``;
    ``fn_by_source`` picks one per ``data_source`` and ``default_fn`` serves the rest. A sample whose
    function raises, returns a non-number or runs past ``timeout_s`` scores ``fallback_score``. A
    function that fails on at least ``abort_failure_rate`` of its rows over its last ``abort_window``
    calls stops the run (null: never).
    """

    default_fn: str = _from(_RewardManager, "default_fn")
    fn_by_source: Mapping[str, str] = field(default_factory=FrozenMap)
    timeout_s: float = _from(_RewardManager, "timeout_s", gt=0)
    fallback_score: float = _from(_RewardManager, "fallback_score")
    num_workers: int = _from(_RewardManager, "num_workers", ge=1)
    kill_grace_s: float = _from(_RewardManager, "kill_grace_s", gt=0)
    shaping: tuple[ShapingConfig, ...] = ()
    abort_failure_rate: float | None = _from(_RewardManager, "abort_failure_rate", gt=0, le=1)
    abort_window: int = _from(_RewardManager, "abort_window", ge=1)


@dataclass(frozen=True)
class RewardModelConfig:
    """A learned reward model scoring each prompt + response, on top of the reward functions of ``reward``.

    ``path`` is a local Hugging Face sequence-classification directory with one label (e.g.
    ``Qwen2ForSequenceClassification``). Each row's score is ``reward score + weight * model score``
    (docs/rewards.md). ``tokenizer`` null scores the policy's token ids as they are (the two models share
    a vocabulary); a tokenizer directory re-tokenises the prompt and the decoded response instead. The
    model is FSDP2-sharded over the ranks of its pool (``resource.placement.reward_model``, default the
    global pool, colocated with the actor); it runs forwards only, ``forward_micro_batch_size`` rows per
    rank, or ``max_tokens_per_micro_batch`` tokens with ``dynamic_batching``. ``param_dtype`` is the
    compute dtype (null: bf16 on GPU, fp32 on CPU); the weights load in ``model.dtype``.
    """

    path: str | None = None
    tokenizer: str | None = _from(_RewardModel, "tokenizer_path")
    weight: float = 1.0
    forward_micro_batch_size: int = _from(_RewardModel, "micro_batch_size", ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = _field(8192, ge=1)
    param_dtype: Dtype | None = field(default=_default_of(_Model, "param_dtype"))


@dataclass(frozen=True)
class KLControlConfig:
    """The in-reward KL coefficient: ``fixed`` at ``kl_coef``, or ``adaptive`` towards ``target_kl``."""

    type: Literal["fixed", "adaptive"] = "fixed"
    kl_coef: float = _field(0.001, ge=0)
    target_kl: float = _field(0.1, gt=0)
    horizon: float = _field(10000.0, gt=0)


@dataclass(frozen=True)
class AlgorithmConfig:
    """The advantage estimator and the KL penalty folded into the reward.

    ``gamma``, ``lam`` and ``norm_by_std`` are passed to the estimator when it takes them (see
    :meth:`advantage_params`), and ``estimator_kwargs`` passes any other keyword argument of it (e.g.
    ``k`` of ``pass_at_k``). ``kl_penalty`` names the KL estimator of the in-reward penalty.
    """

    adv_estimator: str = "grpo"
    gamma: float = _field(1.0, ge=0, le=1)
    lam: float = _field(1.0, ge=0, le=1)
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
    """An extra resource pool for split placement."""

    nodes: int = _field(1, ge=1)
    slots_per_node: int = _field(1, ge=1)


@dataclass(frozen=True)
class ResourceConfig:
    """Device slots and which role runs where.

    The ``global`` pool has ``nodes * slots_per_node`` slots. Roles not named in ``placement`` run on it,
    colocated in one process per slot; mapping a role to a pool from ``pools`` splits it off into
    processes of its own.
    """

    nodes: int = _field(1, ge=1)
    slots_per_node: int = _field(2, ge=1)
    use_gpu: bool = False
    cpus_per_slot: float = _field(1.0, gt=0)
    pools: Mapping[str, PoolConfig] = field(default_factory=FrozenMap)
    placement: Mapping[str, str] = field(default_factory=FrozenMap)

    def pool_of(self, role: str) -> str:
        """Name of the pool that ``role`` runs on."""
        return self.placement.get(role, GLOBAL_POOL)

    def world_size_of(self, role: str) -> int:
        """Number of ranks (slots) of the pool that ``role`` runs on."""
        pool = self.pool_of(role)
        if pool == GLOBAL_POOL:
            return self.nodes * self.slots_per_node
        return self.pools[pool].nodes * self.pools[pool].slots_per_node


@dataclass(frozen=True)
class ResharderConfig:
    """Switching the weights between the training and inference layouts.

    ``max_log_prob_gap`` (null = no check) fails a step whose rollout-vs-trainer log-prob gap
    (``sync/log_prob_abs_diff_max``) exceeds it: a sign that the weight push went wrong.
    """

    bucket_bytes: int = _from(_Resharding, "bucket_bytes", ge=1)
    free_kv_cache: bool = _from(_Resharding, "free_kv_cache")
    max_log_prob_gap: float | None = _field(None, gt=0)


@dataclass(frozen=True)
class TrainerConfig:
    """The run: its length, validation, checkpoints, logging and output folder.

    ``total_steps`` (when set) overrides ``total_epochs``. ``val_every``/``save_every`` 0 means never.
    ``resume`` is ``auto`` (latest checkpoint in ``checkpoint_dir`` if any), ``disable`` or a checkpoint
    path. ``console``: ``quiet`` sends the engine's and Ray's output to ``<output_dir>/logs`` and keeps
    the console to the progress bar, the metric lines and real warnings
    (`hybridflow.metrics.log_routing`); ``verbose`` leaves every process's output on the console.
    """

    total_epochs: int = _field(1, ge=1)
    total_steps: int | None = _field(None, ge=1)
    val_every: int = _field(0, ge=0)
    val_before_train: bool = True
    save_every: int = _field(0, ge=0)
    checkpoint_dir: str = "${trainer.output_dir}/checkpoints"
    resume: str = "auto"
    loggers: tuple[LoggerName, ...] = ("console", "jsonl")
    project: str = "hybridflow"
    experiment: str = "default"
    output_dir: str = "outputs/${trainer.project}/${trainer.experiment}"
    wandb_mode: Literal["online", "offline", "disabled"] = "offline"
    console: Literal["quiet", "verbose"] = "quiet"


@dataclass(frozen=True)
class RunConfig:
    """The whole run. ``critic`` null means no critic (required when the estimator is ``gae``);
    ``reward_model`` null means no reward model (the reward functions alone score). ``recipe`` holds a
    recipe's own settings, read and checked by the recipe (`trainer.config.recipe_settings`)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    critic: CriticConfig | None = None
    reward: RewardConfig = field(default_factory=RewardConfig)
    reward_model: RewardModelConfig | None = None
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    resource: ResourceConfig = field(default_factory=ResourceConfig)
    resharding: ResharderConfig = field(default_factory=ResharderConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    recipe: Mapping[str, Any] = field(default_factory=FrozenMap)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)

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
