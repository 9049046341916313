"""`PolicyObjective`: the loss `update_actor` minimises, assembled from registered algorithms; and
whether the update may leave out the rows whose advantage is zero (`skips_zero_advantage_rows`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

from hybridflow.algos import (
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    ROLLOUT_CORRECTION_LEVELS,
    aggregate_loss,
    cispo_loss,
    clip_cov_loss,
    compute_kl,
    compute_policy_loss,
    entropy_bonus,
    gmpo_loss,
    gspo_loss,
    kl_cov_loss,
    ppo_clip_loss,
    reinforce_loss,
    rollout_correction_weights,
    sapo_loss,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from hybridflow.contract import SAMPLED_MASK
from hybridflow.protocol import Batch

__all__ = ["ActorLoss", "PolicyObjective", "SkipSetting", "skips_zero_advantage_rows"]

SkipSetting = bool | Literal["auto"]
"""``actor.skip_zero_advantage_rows``: ``"auto"`` (where exact), ``True`` (required) or ``False``."""

# Policy losses whose per-token value is ``-A * f(...)``: exactly 0, with zero gradient, at a token
# whose advantage is 0, and computed from that token's own row only.
_ROW_LOCAL_LOSSES = frozenset({ppo_clip_loss, gspo_loss, reinforce_loss, cispo_loss, sapo_loss, gmpo_loss})
# Shipped losses that take statistics over all tokens of the call: other rows change what they do.
_BATCH_COUPLED_LOSSES = {
    clip_cov_loss: "the tokens it detaches are chosen by a covariance over every row of the micro-batch",
    kl_cov_loss: "its KL penalty falls on zero-advantage tokens too, chosen by a covariance over every row",
}
# Sums of per-row terms over batch-wide counts: a row whose terms are 0 adds nothing.
_ROW_ADDITIVE_AGGREGATIONS = frozenset(
    {token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm}
)


class ActorLoss(Protocol):
    """What `update_actor` accepts as its loss: a recipe can pass any callable of this shape.

    A loss declares the columns it reads besides ``hybridflow.contract.MODEL_INPUTS`` and
    ``advantages`` in ``reads`` (e.g. ``("old_log_probs", "my_token_weights")``): `trainer.steps.update_actor`
    sends them, and refuses a batch that lacks one, naming it. ``old_log_probs`` may be absent for one
    on-policy optimizer step: the update then takes them from its own forward.

    Its ``response_mask`` is each token's loss weight (`hybridflow.contract.loss_response_mask`): the
    real one times the step's ``loss_mask`` when the batch has one (float weights >= 0 then); the
    forward used the real one. A loss honours the weights by multiplying each token's term by its
    weight and counting the tokens of non-zero weight, as `PolicyObjective` does.

    Args:
        log_prob: ``[micro_batch, response_len]`` current log-probs (nats), with gradient.
        entropy: ``[micro_batch, response_len]`` per-token entropy (nats), or ``None``.
        micro_batch: the rows (``old_log_probs``, ``advantages``, ``response_mask``, what ``reads`` names).
        global_tokens: response tokens of non-zero weight in the whole mini-batch over all ranks.
        global_seqs: rows in the whole mini-batch over all ranks.

    Only a `PolicyObjective` is ever called with rows left out (`skips_zero_advantage_rows`), and
    then with a keyword ``metric_tokens``; a recipe's own callable is always called on every row.

    Returns:
        this micro-batch's share of the mini-batch loss (shares over micro-batches and ranks add up
        to the loss of the whole mini-batch), and scalar metrics.
    """

    needs_entropy: bool
    reads: tuple[str, ...]

    def __call__(
        self,
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        micro_batch: Batch,
        global_tokens: float,
        global_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


@dataclass(frozen=True)
class PolicyObjective:
    """Policy loss + entropy bonus + KL-to-reference loss, each a registered function.

    Each term multiplies a token's loss by the token's weight in ``response_mask`` (a step's
    ``loss_mask``) and normalises by the counts of tokens of non-zero weight. The metrics
    ``actor/pg_loss`` and ``actor/kl_loss`` are the weighted terms; ``actor/entropy`` and the policy
    loss's own metrics (``actor/clip_frac``, ``actor/approx_kl``, ...) count each such token once.

    The names are resolved to their functions when the objective is built, and the functions travel
    with it. Build it (or the `ActorConfig` that builds it) in the controller process, where a recipe's
    own registrations exist: Ray pickles the functions into the worker processes, which never import
    the recipe (functions defined in ``__main__`` or inside another function are pickled by value).

    Attributes:
        policy_loss: name in ``POLICY_LOSSES`` (``ppo_clip``, ``gspo``, ``reinforce``, ...).
        params: keyword arguments of the policy loss (``clip_eps_low``, ``dual_clip_c``, ...).
        loss_agg_mode: name in ``AGGREGATION_MODES``.
        norm_constant: the constant of ``seq-mean-token-sum-norm``.
        entropy_coef: weight of the entropy bonus (needs per-token entropy).
        kl_loss_coef: weight of the KL term (needs ``ref_log_probs`` in the batch).
        kl_estimator: name in ``KL_ESTIMATORS`` (resolved, and so checked, even when the KL term is off).
        rollout_correction: ``"none"``, or ``"token"`` / ``"sequence"``: multiply the per-token policy
            loss by truncated importance weights of ``old_log_probs`` against the engine's
            ``rollout_log_probs`` (`hybridflow.algos.rollout_correction`); needs that column.
        rollout_correction_cap: the truncation ``C`` of those weights.

    Raises:
        UnknownNameError: on construction, for a name that is not registered in this process (the
            message lists the valid ones).
        ValueError: on construction, for an unknown ``rollout_correction`` or a cap that is not > 0.
    """

    policy_loss: str = "ppo_clip"
    params: dict[str, Any] = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0
    kl_estimator: str = "k3"
    rollout_correction: str = "none"
    rollout_correction_cap: float = 2.0

    def __post_init__(self) -> None:
        if self.rollout_correction not in ("none", *ROLLOUT_CORRECTION_LEVELS):
            raise ValueError(
                f"rollout_correction must be one of {('none', *ROLLOUT_CORRECTION_LEVELS)}, "
                f"got {self.rollout_correction!r}"
            )
        if not self.rollout_correction_cap > 0:
            raise ValueError(f"rollout_correction_cap must be > 0, got {self.rollout_correction_cap}")
        # Not dataclass fields: kept out of equality, repr and config dumps, but pickled with the object.
        object.__setattr__(self, "_policy_loss_fn", POLICY_LOSSES.get(self.policy_loss))
        object.__setattr__(self, "_aggregation_fn", AGGREGATION_MODES.get(self.loss_agg_mode))
        object.__setattr__(self, "_kl_estimator_fn", KL_ESTIMATORS.get(self.kl_estimator))

    @property
    def policy_loss_fn(self) -> Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """The function ``policy_loss`` named when the objective was built."""
        return self._policy_loss_fn  # type: ignore[attr-defined]

    @property
    def aggregation_fn(self) -> Callable[..., torch.Tensor]:
        """The function ``loss_agg_mode`` named when the objective was built."""
        return self._aggregation_fn  # type: ignore[attr-defined]

    @property
    def kl_estimator_fn(self) -> Callable[..., torch.Tensor]:
        """The function ``kl_estimator`` named when the objective was built."""
        return self._kl_estimator_fn  # type: ignore[attr-defined]

    @property
    def needs_entropy(self) -> bool:
        return self.entropy_coef != 0.0

    @property
    def reads(self) -> tuple[str, ...]:
        """The columns this objective reads besides the model inputs and ``advantages``:
        ``old_log_probs``, plus ``ref_log_probs`` with a KL loss and ``rollout_log_probs`` with a
        rollout correction."""
        return (
            "old_log_probs",
            *(("ref_log_probs",) if self.kl_loss_coef else ()),
            *(("rollout_log_probs",) if self.rollout_correction != "none" else ()),
        )

    @property
    def zero_advantage_obstacles(self) -> tuple[str, ...]:
        """Why leaving the zero-advantage rows out of the update would change its gradient; empty
        when it would not (or when the objective uses a recipe's function that cannot be judged)."""
        obstacles = []
        if self.kl_loss_coef:
            obstacles.append("the KL loss (kl_loss_coef) has a value and a gradient on every row")
        if self.entropy_coef:
            obstacles.append("the entropy bonus (entropy_coef) has a value and a gradient on every row")
        if self.policy_loss_fn in _BATCH_COUPLED_LOSSES:
            obstacles.append(
                f"policy loss {self.policy_loss!r}: {_BATCH_COUPLED_LOSSES[self.policy_loss_fn]}"
            )
        return tuple(obstacles)

    @property
    def zero_advantage_verified(self) -> bool:
        """Whether the policy loss and the aggregation are shipped functions known to give a
        zero-advantage row exactly zero value and gradient, whatever the other rows hold."""
        return self.policy_loss_fn in _ROW_LOCAL_LOSSES and self.aggregation_fn in _ROW_ADDITIVE_AGGREGATIONS

    def __call__(
        self,
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        micro_batch: Batch,
        global_tokens: float,
        global_seqs: float,
        *,
        metric_tokens: float | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """`ActorLoss`; ``metric_tokens`` is the valid-token count the per-token metrics average over
        (over all ranks and micro-batches), when it differs from ``global_tokens``: the tokens of the
        rows that entered the update, when zero-advantage rows were left out."""
        mask = micro_batch["response_mask"]
        aggregation = self.aggregation_fn
        norms = {
            # The function, not the name: this process's registry may not hold the name.
            "loss_agg_mode": aggregation,
            "global_token_count": global_tokens,
            "global_seq_count": global_seqs,
            "norm_constant": self.norm_constant,
        }
        # Token-weighted so that summing over micro-batches (and ranks) gives the mini-batch mean.
        metric_tokens = global_tokens if metric_tokens is None else metric_tokens
        share = mask.bool().sum().item() / metric_tokens if metric_tokens else 0.0
        metrics: dict[str, float] = {}
        policy_norms = norms
        if self.rollout_correction != "none":
            weights, correction = self._rollout_weights(micro_batch)
            policy_norms = {**norms, "loss_agg_mode": _weighted_aggregation(aggregation, weights)}
            metrics.update({f"rollout_correction/{k}": v.item() * share for k, v in correction.items()})
        loss, raw = compute_policy_loss(
            self.policy_loss_fn,
            log_prob,
            micro_batch["old_log_probs"],
            micro_batch["advantages"],
            mask,
            **policy_norms,
            **self.params,
        )
        metrics.update({f"actor/{k}": v.item() * share for k, v in raw.items()})
        metrics["actor/pg_loss"] = loss.item()
        if self.entropy_coef:
            if entropy is None:
                raise ValueError("entropy_coef is set but no entropy was computed")
            bonus, mean_entropy = entropy_bonus(mask, coef=self.entropy_coef, entropy=entropy, **norms)
            loss = loss + bonus
            metrics["actor/entropy"] = mean_entropy.item()
        if self.kl_loss_coef:
            kl = compute_kl(log_prob, micro_batch["ref_log_probs"], self.kl_estimator_fn)
            kl_loss = aggregate_loss(kl, mask, aggregation, global_tokens, global_seqs, self.norm_constant)
            loss = loss + self.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return loss, metrics

    def _rollout_weights(self, micro_batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if "rollout_log_probs" not in micro_batch:
            raise KeyError(
                f"actor.rollout_correction={self.rollout_correction!r} needs the column 'rollout_log_probs' "
                "(the engine's log-probs of its samples) in the update's batch; it has: "
                f"{', '.join(sorted(micro_batch.keys()))}"
            )
        # The importance ratios run over the tokens the engine sampled, not over the loss weights: the
        # actor writes ``sampled_mask`` whenever a ``loss_mask`` replaces ``response_mask``.
        sampled = micro_batch[SAMPLED_MASK] if SAMPLED_MASK in micro_batch else micro_batch["response_mask"]
        return rollout_correction_weights(
            micro_batch["old_log_probs"],
            micro_batch["rollout_log_probs"],
            sampled,
            level=self.rollout_correction,
            cap=self.rollout_correction_cap,
        )


def _weighted_aggregation(
    aggregation: Callable[..., torch.Tensor], weights: torch.Tensor
) -> Callable[..., torch.Tensor]:
    """``aggregation`` applied to ``loss_mat * weights``: every policy loss hands its per-token loss
    ``[batch, response_len]`` to the aggregation it was given, so this weights any of them per token."""

    def weighted(loss_mat: torch.Tensor, mask: torch.Tensor, **counts: Any) -> torch.Tensor:
        return aggregation(loss_mat * weights, mask, **counts)

    return weighted


def skips_zero_advantage_rows(setting: SkipSetting, loss_fn: ActorLoss) -> bool:
    """Whether `update_actor` leaves out the rows whose advantage is zero at every valid token.

    Such a row changes nothing when the loss gives it exactly zero value and gradient and the other
    rows' terms do not depend on it; the normalisers keep the counts of the full mini-batch, so the
    gradient is the same. ``"auto"`` skips when that is known (`PolicyObjective.zero_advantage_verified`
    and no obstacle); ``True`` skips unless there is an obstacle (a recipe's own policy loss or
    aggregation is then taken to be exact); ``False`` never skips.

    Raises:
        ValueError: ``True`` with an objective that has an obstacle (a KL loss, an entropy bonus, a
            covariance-based loss), or with a ``loss_fn`` that is not a `PolicyObjective`.
    """
    if setting is False:
        return False
    if setting not in (True, "auto"):
        raise ValueError(f"actor.skip_zero_advantage_rows must be 'auto', true or false, got {setting!r}")
    if not isinstance(loss_fn, PolicyObjective):
        if setting is True:
            raise ValueError(
                "actor.skip_zero_advantage_rows=true needs a PolicyObjective loss; a custom loss_fn "
                f"({type(loss_fn).__name__}) may have terms on zero-advantage rows: set it to auto or false"
            )
        return False
    obstacles = loss_fn.zero_advantage_obstacles
    if setting is True and obstacles:
        raise ValueError(
            "actor.skip_zero_advantage_rows=true would change the update: "
            + "; ".join(obstacles)
            + ". Set it to auto (skips only where exact) or false"
        )
    return not obstacles and (setting is True or loss_fn.zero_advantage_verified)
