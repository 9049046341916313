"""The worker roles' sections of a run config (``actor``, ``critic``, ``ref``, ``reward_model``,
``teacher``), which are the workers' own settings, and what each role takes from outside its section
(`ActorDerived`, `CriticDerived`: computed once by ``trainer.config.derive_values``, never written back).

docs/config.md describes every key. Batch sizes count rows (responses), not prompts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridflow.config_fields import Dtype, FrozenMap, check_bounds, config_field
from hybridflow.lora import LoraConfig
from hybridflow.rollout.config import EngineDerived
from workers.objective import PolicyObjective

__all__ = [
    "ActorConfig",
    "ActorDerived",
    "CriticConfig",
    "CriticDerived",
    "OptimizedRoleConfig",
    "RefConfig",
    "RewardModelConfig",
    "TeacherConfig",
]


def _loss_argument(default: Any, **bounds: float) -> Any:
    """An actor field passed by its name to the policy loss when it is not null
    (`ActorConfig.policy_loss_params`); the rules refuse one set for a loss that does not take it."""
    spec = config_field(default, **bounds)
    return dataclasses.field(default=default, metadata={**spec.metadata, "loss_argument": True})


@dataclass(frozen=True)
class OptimizedRoleConfig:
    """Settings shared by the roles that train (actor, critic): optimizer, batching, precision.

    ``ppo_mini_batch_size`` rows across all ranks make one optimizer step; ``ppo_micro_batch_size`` rows
    on one rank make one forward/backward. With ``dynamic_batching`` the micro-batches are instead
    packed up to ``max_tokens_per_micro_batch`` tokens per rank. ``forward_micro_batch_size`` is the
    per-rank row count of no-grad forwards (log-probs, values). ``lr_scheduler``: ``constant``,
    ``linear`` (decay to 0) or ``cosine`` (decay to ``min_lr_ratio``) after
    ``warmup_steps`` optimizer steps of linear warm-up from 0. ``grad_clip`` null disables clipping
    (the norm is still reported). ``param_dtype`` null is the device's default compute dtype (bf16 on
    GPU, fp32 on CPU; `hybridflow.parallel.DevicePlan`). ``use_packing`` packs each micro-batch's valid
    tokens into one row (no compute on padding). ``gather_once_per_mini_batch`` gathers the FSDP2 weights
    once per optimizer step instead of twice per micro-batch and reduces the gradients once (more memory:
    the gathered weights and an unsharded fp32 gradient; `hybridflow.parallel.accumulation_steps`).
    """

    lr: float = config_field(1e-6, gt=0)
    lr_scheduler: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = config_field(0, ge=0)
    min_lr_ratio: float = config_field(0.0, ge=0, le=1)
    weight_decay: float = config_field(0.01, ge=0)
    betas: tuple[float, ...] = (0.9, 0.999)
    grad_clip: float | None = config_field(1.0, gt=0)
    ppo_mini_batch_size: int = config_field(64, ge=1)
    ppo_micro_batch_size: int = config_field(4, ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = config_field(8192, ge=1)
    forward_micro_batch_size: int = config_field(8, ge=1)
    ppo_epochs: int = config_field(1, ge=1)
    shuffle: bool = False
    param_dtype: Dtype | None = None
    activation_checkpointing: bool = False
    use_packing: bool = True
    gather_once_per_mini_batch: bool = False

    @property
    def token_budget(self) -> int | None:
        """Valid tokens per micro-batch and rank under ``dynamic_batching``; None without it."""
        return self.max_tokens_per_micro_batch if self.dynamic_batching else None


@dataclass(frozen=True)
class ActorConfig(OptimizedRoleConfig):
    """The ``actor`` section: the policy update. Names are checked against the ``hybridflow.algos``
    registries when the config loads.

    ``clip_eps_low``/``clip_eps_high`` bound the ratio to ``[1 - low, 1 + high]``; ``dual_clip_c``
    (> 1) caps the loss of negative-advantage tokens. Null leaves each at the chosen loss's own default
    (``ppo_clip`` 0.2, ``gspo`` 3e-4/4e-4, ``gmpo`` 0.4, ...; docs/algorithms.md); a value is passed
    only to a loss that takes it. ``policy_loss_kwargs`` passes any other keyword argument of the
    chosen policy loss (e.g. ``tau_neg`` of ``sapo``), and overrides the three clip keys for it.
    ``kl_estimator`` and ``kl_loss_coef`` apply when ``use_kl_loss`` is true. ``skip_zero_advantage_rows``
    leaves rows with zero advantage at every token out of the update (``auto``: where the gradient is
    provably unchanged; ``true`` is refused with a KL loss, an entropy bonus or a covariance-based loss;
    `workers.objective.skips_zero_advantage_rows`). ``rollout_correction`` (``token``, ``sequence``)
    weights the policy loss by truncated importance weights, capped at ``rollout_correction_cap``, of
    the trainer's log-probs against the engine's. ``param_offload``/``optimizer_offload`` move the
    parameter shards and the optimizer state to host memory while the engine generates.
    ``logit_chunk_size`` positions of logits are materialised at once in the log-prob forwards (null:
    all of them). ``lora`` trains LoRA adapters on the frozen base weights instead of the whole model
    (`hybridflow.lora.LoraConfig`, docs/lora.md); null trains every weight. ``keep_freed_host_memory``
    makes each actor process's C allocator keep what it frees instead of unmapping it, so the update's
    buffers are not faulted in again every micro-batch (`hybridflow.resharding.memory.keep_freed_host_memory`;
    the resident size stays at its high-water mark).
    """

    param_offload: bool = False
    optimizer_offload: bool = False
    lora: LoraConfig | None = None
    policy_loss: str = "ppo_clip"
    clip_eps_low: float | None = _loss_argument(None, ge=0)
    clip_eps_high: float | None = _loss_argument(None, ge=0)
    dual_clip_c: float | None = _loss_argument(None, gt=1)
    loss_agg_mode: str = "token-mean"
    entropy_coef: float = config_field(0.0, ge=0)
    use_kl_loss: bool = False
    kl_loss_coef: float = config_field(0.001, ge=0)
    kl_estimator: str = "k3"
    policy_loss_kwargs: Mapping[str, Any] = field(default_factory=FrozenMap)
    skip_zero_advantage_rows: Literal["auto", True, False] = "auto"
    rollout_correction: Literal["none", "token", "sequence"] = "none"
    rollout_correction_cap: float = config_field(2.0, gt=0)
    logit_chunk_size: int | None = config_field(1024, ge=1)
    keep_freed_host_memory: bool = False

    def __post_init__(self) -> None:
        check_bounds(self, "actor")

    def loss_arguments(self) -> dict[str, Any]:
        """The fields passed by name to the policy loss (the clip keys), null ones included."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("loss_argument")}

    def policy_loss_params(self) -> dict[str, Any]:
        """The loss arguments this config sets (not null), then ``policy_loss_kwargs``, as the policy
        loss's keyword arguments: every one left out keeps the loss's own default. The config's rules
        refuse a set argument that the chosen loss does not take."""
        given = {name: value for name, value in self.loss_arguments().items() if value is not None}
        return {**given, **self.policy_loss_kwargs}

    def objective(self, norm_constant: float | None = None) -> PolicyObjective:
        """The loss `update_actor` minimises by default, its registered functions resolved in this
        process (build it on the controller, where a recipe's registrations exist).

        Args:
            norm_constant: the constant of ``seq-mean-token-sum-norm`` (a run's is
                ``data.max_response_length``).
        """
        return PolicyObjective(
            self.policy_loss,
            self.policy_loss_params(),
            self.loss_agg_mode,
            norm_constant,
            self.entropy_coef,
            self.kl_loss_coef if self.use_kl_loss else 0.0,
            self.kl_estimator,
            self.rollout_correction,
            self.rollout_correction_cap,
        )


@dataclass(frozen=True)
class CriticConfig(OptimizedRoleConfig):
    """The ``critic`` section: a value head on the policy's own backbone (required by the ``gae``
    estimator). ``cliprange_value`` (in the unit of the returns) clips the values around the old ones;
    null gives the plain squared error.

    Its learning rate defaults higher than the actor's (a freshly initialised value head).
    """

    lr: float = config_field(1e-5, gt=0)
    cliprange_value: float | None = config_field(0.5, gt=0)
    loss_agg_mode: str = "token-mean"

    def __post_init__(self) -> None:
        check_bounds(self, "critic")


@dataclass(frozen=True)
class RefConfig:
    """The ``ref`` section: the frozen reference policy, held by the actor's processes when
    ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``. ``param_offload`` keeps its shards in host
    memory between uses."""

    forward_micro_batch_size: int = config_field(8, ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = config_field(8192, ge=1)
    param_offload: bool = False

    def __post_init__(self) -> None:
        check_bounds(self, "ref")

    @property
    def token_budget(self) -> int | None:
        """Valid tokens per forward and rank under ``dynamic_batching``; None without it."""
        return self.max_tokens_per_micro_batch if self.dynamic_batching else None


@dataclass(frozen=True)
class RewardModelConfig:
    """The ``reward_model`` section: a learned reward model scoring each prompt + response, on top of
    the reward functions of ``reward``.

    ``path`` is a local Hugging Face sequence-classification directory with one label (e.g.
    ``Qwen2ForSequenceClassification``). Each row's score is ``reward score + weight * model score``
    (docs/rewards.md). ``tokenizer`` null scores the policy's token ids as they are (the two models share
    a vocabulary); a tokenizer directory re-tokenises the prompt and the decoded response instead. The
    model is FSDP2-sharded over the ranks of its pool; it runs forwards only, ``forward_micro_batch_size``
    rows per rank, or ``max_tokens_per_micro_batch`` tokens with ``dynamic_batching``. ``param_dtype`` is
    the compute dtype (null: bf16 on GPU, fp32 on CPU); the weights load in ``model.dtype``.
    ``use_packing`` packs each forward's valid tokens into one row.
    """

    path: str | None = None
    tokenizer: str | None = None
    weight: float = 1.0
    forward_micro_batch_size: int = config_field(8, ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = config_field(8192, ge=1)
    param_dtype: Dtype | None = None
    use_packing: bool = True

    def __post_init__(self) -> None:
        check_bounds(self, "reward_model")

    @property
    def token_budget(self) -> int | None:
        """Valid tokens per forward and rank under ``dynamic_batching``; None without it."""
        return self.max_tokens_per_micro_batch if self.dynamic_batching else None


@dataclass(frozen=True)
class TeacherConfig:
    """The ``teacher`` section: a frozen model that scores the student's sampled tokens (on-policy
    distillation). ``path`` is a local Hugging Face causal-LM directory whose tokenizer is the actor's.

    The model is FSDP2-sharded over the ranks of its pool and runs forwards only,
    ``forward_micro_batch_size`` rows per rank, or ``max_tokens_per_micro_batch`` tokens with
    ``dynamic_batching``. ``param_dtype`` is the compute dtype (null: bf16 on GPU, fp32 on CPU); the
    weights load in ``model.dtype``. ``use_packing`` packs each forward's valid tokens into one row;
    ``logit_chunk_size`` positions of logits are materialised at once (null: all of them).
    ``param_offload`` keeps the shards in host memory between uses.
    """

    path: str | None = None
    forward_micro_batch_size: int = config_field(8, ge=1)
    dynamic_batching: bool = False
    max_tokens_per_micro_batch: int = config_field(8192, ge=1)
    param_dtype: Dtype | None = None
    use_packing: bool = True
    logit_chunk_size: int | None = config_field(1024, ge=1)
    param_offload: bool = False

    def __post_init__(self) -> None:
        check_bounds(self, "teacher")

    @property
    def token_budget(self) -> int | None:
        """Valid tokens per forward and rank under ``dynamic_batching``; None without it."""
        return self.max_tokens_per_micro_batch if self.dynamic_batching else None


@dataclass(frozen=True)
class ActorDerived:
    """What the actor/rollout worker takes from outside its sections.

    Attributes:
        model_path: the policy's Hugging Face directory (``model.path``, or the tiny model built there).
        objective: the default loss of ``update_actor`` (`ActorConfig.objective`), resolved on the
            controller: a recipe's own registered functions travel with it.
        dtype: the master weights' dtype as loaded (``model.dtype``).
        optimizer_steps: optimizer steps the learning-rate schedule spans (the run's steps times
            ``optimizer_steps_per_step``).
        seed: seed of the mini-batch shuffle (``data.seed``).
        with_ref: also hold the frozen reference policy (``RunConfig.needs_reference``).
        engine: the engine's dtype and ``max_model_len``.
        rollout_split: the engines run in a rollout pool of their own (``resource.placement.rollout``):
            the actor holds none and pushes its weights over the weight group.
    """

    model_path: str
    objective: PolicyObjective
    dtype: Dtype = "float32"
    optimizer_steps: int = 1
    seed: int = 0
    with_ref: bool = True
    engine: EngineDerived = field(default_factory=EngineDerived)
    rollout_split: bool = False


@dataclass(frozen=True)
class CriticDerived:
    """What the critic worker takes from outside its section.

    Attributes:
        model_path: the backbone's directory (the policy's; its ``lm_head`` is not loaded).
        aggregation: the function ``critic.loss_agg_mode`` names, resolved on the controller (unlike the
            name, it is known in every worker process).
        dtype, optimizer_steps, seed: as for `ActorDerived`; the seed also draws the value head's
            initial weights (the same on every rank).
        loss_norm_constant: the constant of ``seq-mean-token-sum-norm`` (``data.max_response_length``).
    """

    model_path: str
    aggregation: Callable[..., Any]
    dtype: Dtype = "float32"
    optimizer_steps: int = 1
    seed: int = 0
    loss_norm_constant: float | None = None
