"""Settings of the worker roles, as frozen dataclasses (the trainer's config sections use them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.algos import AGGREGATION_MODES
from workers.objective import PolicyObjective, SkipSetting, skips_zero_advantage_rows

__all__ = ["ActorConfig", "CriticConfig", "ModelConfig", "OptimConfig", "RewardModelConfig"]

_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """Which model a role loads.

    Attributes:
        path: a Hugging Face model directory (config, weights, tokenizer).
        dtype: dtype of the FSDP2 master weights (``float32`` recommended; mixed precision is separate).
        activation_checkpointing: recompute each decoder layer in backward instead of storing it.
        param_dtype: compute dtype under FSDP2 mixed precision; ``None`` is the worker's default
            (`hybridflow.parallel.DevicePlan`: bf16 on GPU, fp32 on CPU). Set ``"float32"`` for exact
            comparisons.
    """

    path: str = ""
    dtype: str = "float32"
    activation_checkpointing: bool = False
    param_dtype: str | None = None

    def __post_init__(self) -> None:
        for key in ("dtype", "param_dtype"):
            value = getattr(self, key)
            if value is not None and value not in _DTYPES:
                raise ValueError(f"model.{key} must be one of {_DTYPES}, got {value!r}")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and its learning-rate schedule.

    Attributes:
        lr: peak learning rate.
        weight_decay: AdamW decoupled weight decay.
        betas: AdamW betas.
        grad_clip: max global gradient norm; ``0`` disables clipping (the norm is still reported).
        schedule: ``"constant"``, ``"linear"`` (decay to 0) or ``"cosine"`` (decay to ``min_lr_ratio``).
        warmup_steps: optimizer steps of linear warm-up from 0.
        total_steps: optimizer steps the schedule spans (for linear and cosine).
        min_lr_ratio: the cosine schedule's floor, as a fraction of ``lr``.
    """

    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 0
    min_lr_ratio: float = 0.0

    def __post_init__(self) -> None:
        if self.schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"optim.schedule must be constant, linear or cosine, got {self.schedule!r}")
        if self.schedule != "constant" and self.total_steps <= 0:
            raise ValueError(f"optim.total_steps must be > 0 for the {self.schedule} schedule")
        object.__setattr__(self, "betas", tuple(self.betas))


@dataclass(frozen=True)
class ActorConfig:
    """How the actor trains.

    Attributes:
        optim: optimizer settings.
        mini_batch_size: rows (samples, not prompts) per optimizer step, over all ranks.
        micro_batch_size: rows per forward/backward on one rank (gradient accumulation in between);
            ignored when ``max_tokens_per_micro_batch`` is set.
        forward_micro_batch_size: rows per no-grad forward on one rank (log-probs).
        max_tokens_per_micro_batch: dynamic micro-batching: each micro-batch holds at most this many
            valid tokens per rank.
        ref_forward_micro_batch_size: rows per forward of the reference policy on one rank
            (``compute_ref_log_prob``); ignored when ``ref_max_tokens_per_micro_batch`` is set.
        ref_max_tokens_per_micro_batch: dynamic micro-batching of the reference forward, in valid
            tokens per rank.
        epochs: passes over each step's rollouts.
        shuffle: shuffle rows between mini-batches (seeded by ``seed``).
        seed: seed of the shuffle.
        use_packing: pack valid tokens into one row (no compute on padding).
        logit_chunk_size: tokens whose logits exist at once in the log-prob head (bounds memory).
        policy_loss: registered policy-loss name (``hybridflow.algos.POLICY_LOSSES``).
        policy_loss_params: extra keyword arguments of the policy loss (e.g. clip ranges).
        loss_agg_mode: registered aggregation mode.
        loss_norm_constant: the constant of ``seq-mean-token-sum-norm`` (e.g. the max response length).
        entropy_coef: weight of the entropy bonus.
        kl_loss_coef: weight of a KL-to-reference term in the loss (0 disables it).
        kl_estimator: registered KL estimator for the KL loss.
        skip_zero_advantage_rows: leave rows whose advantage is zero at every token out of the update's
            forward and backward (the gradient is unchanged): ``"auto"`` where that is exact, ``True``
            (refused with a KL loss, an entropy bonus or a covariance-based loss) or ``False``; see
            `workers.objective.skips_zero_advantage_rows`.
        rollout_correction: ``"none"``, ``"token"`` or ``"sequence"``: truncated importance weights of
            the trainer's log-probs against the engine's ``rollout_log_probs`` on the policy loss
            (`hybridflow.algos.rollout_correction`).
        rollout_correction_cap: the truncation of those weights.

    The three registered names are resolved when the config is built (`objective`), so build it in
    the controller process: a recipe's own policy loss, aggregation mode or KL estimator then reaches
    the workers with the config, and an unknown name fails here, listing the valid ones.
    """

    optim: OptimConfig = field(default_factory=OptimConfig)
    mini_batch_size: int = 64
    micro_batch_size: int = 4
    forward_micro_batch_size: int = 8
    max_tokens_per_micro_batch: int | None = None
    ref_forward_micro_batch_size: int = 8
    ref_max_tokens_per_micro_batch: int | None = None
    epochs: int = 1
    shuffle: bool = False
    seed: int = 0
    use_packing: bool = True
    logit_chunk_size: int | None = 1024
    policy_loss: str = "ppo_clip"
    policy_loss_params: dict[str, Any] = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"
    loss_norm_constant: float | None = None
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0
    kl_estimator: str = "k3"
    skip_zero_advantage_rows: SkipSetting = "auto"
    rollout_correction: str = "none"
    rollout_correction_cap: float = 2.0

    def __post_init__(self) -> None:
        for key in ("mini_batch_size", "micro_batch_size", "forward_micro_batch_size", "ref_forward_micro_batch_size", "epochs"):
            if getattr(self, key) < 1:
                raise ValueError(f"actor.{key} must be >= 1, got {getattr(self, key)}")
        objective = PolicyObjective(
            self.policy_loss,
            dict(self.policy_loss_params),
            self.loss_agg_mode,
            self.loss_norm_constant,
            self.entropy_coef,
            self.kl_loss_coef,
            self.kl_estimator,
            self.rollout_correction,
            self.rollout_correction_cap,
        )
        # Refused here, on the controller, rather than at the first update.
        skips_zero_advantage_rows(self.skip_zero_advantage_rows, objective)
        # Not a field (kept out of equality, repr and config dumps) but pickled with the config.
        object.__setattr__(self, "_objective", objective)

    @property
    def objective(self) -> PolicyObjective:
        """The default loss of ``update_actor``, its functions resolved when this config was built."""
        return self._objective  # type: ignore[attr-defined]


@dataclass(frozen=True)
class CriticConfig:
    """How the critic trains (a value head on a causal-LM backbone).

    Attributes:
        model: the backbone (a causal-LM directory; its ``lm_head`` is not loaded).
        optim: optimizer settings.
        mini_batch_size, micro_batch_size, max_tokens_per_micro_batch, epochs, shuffle, use_packing:
            as for `ActorConfig`.
        forward_micro_batch_size: rows per no-grad forward on one rank (``compute_values``); ignored
            when ``max_tokens_per_micro_batch`` is set.
        seed: seed of the shuffle and of the value head's initial weights (the same on every rank).
        cliprange_value: clip range of the PPO clipped value loss, in the unit of the returns;
            ``None`` gives the plain squared error.
        loss_agg_mode: registered aggregation of the value loss; resolved when the config is built
            (`aggregation`), as for `ActorConfig`.
        loss_norm_constant: the constant of ``seq-mean-token-sum-norm``.
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    mini_batch_size: int = 64
    micro_batch_size: int = 4
    forward_micro_batch_size: int = 8
    max_tokens_per_micro_batch: int | None = None
    epochs: int = 1
    shuffle: bool = False
    seed: int = 0
    use_packing: bool = True
    cliprange_value: float | None = 0.5
    loss_agg_mode: str = "token-mean"
    loss_norm_constant: float | None = None

    def __post_init__(self) -> None:
        for key in ("mini_batch_size", "micro_batch_size", "forward_micro_batch_size", "epochs"):
            if getattr(self, key) < 1:
                raise ValueError(f"critic.{key} must be >= 1, got {getattr(self, key)}")
        if self.cliprange_value is not None and self.cliprange_value <= 0:
            raise ValueError(f"critic.cliprange_value must be > 0 or None, got {self.cliprange_value}")
        object.__setattr__(self, "_aggregation", AGGREGATION_MODES.get(self.loss_agg_mode))

    @property
    def aggregation(self) -> Callable[..., Any]:
        """The function ``loss_agg_mode`` named when this config was built (pass it as the value loss's
        ``loss_agg_mode``: unlike the name, it is known in every worker process)."""
        return self._aggregation  # type: ignore[attr-defined]


@dataclass(frozen=True)
class RewardModelConfig:
    """How the reward model scores (inference only).

    Attributes:
        model: a sequence-classification directory with one label (e.g. ``Qwen2ForSequenceClassification``).
        micro_batch_size: rows per forward on one rank; ignored when ``max_tokens_per_micro_batch`` is set.
        max_tokens_per_micro_batch: dynamic micro-batching by valid tokens per rank.
        use_packing: pack valid tokens into one row (no compute on padding).
        tokenizer_path: the reward model's tokenizer directory. ``None`` scores the policy's token ids
            as they are (the two models share a vocabulary). Set, the batch must carry the text
            columns below, and prompt + response are re-tokenised with this tokenizer.
        prompt_column: non-tensor column with each prompt: a string, or chat messages rendered with
            the tokenizer's chat template.
        response_column: non-tensor column with each decoded response (str).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    micro_batch_size: int = 8
    max_tokens_per_micro_batch: int | None = None
    use_packing: bool = True
    tokenizer_path: str | None = None
    prompt_column: str = "raw_prompt"
    response_column: str = "response_text"

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise ValueError(f"reward_model.micro_batch_size must be >= 1, got {self.micro_batch_size}")
