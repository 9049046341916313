"""`PolicyObjective`: the loss `update_actor` minimises, assembled from registered algorithms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from hybridflow.algos import (
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    aggregate_loss,
    compute_kl,
    compute_policy_loss,
    entropy_bonus,
)
from hybridflow.protocol import Batch

__all__ = ["ActorLoss", "PolicyObjective"]


class ActorLoss(Protocol):
    """What `update_actor` accepts as its loss: a recipe can pass any callable of this shape.

    Args:
        log_prob: ``[micro_batch, response_len]`` current log-probs (nats), with gradient.
        entropy: ``[micro_batch, response_len]`` per-token entropy (nats), or ``None``.
        micro_batch: the rows (``old_log_probs``, ``advantages``, ``response_mask``, ...).
        global_tokens: valid response tokens in the whole mini-batch over all ranks.
        global_seqs: rows in the whole mini-batch over all ranks.

    Returns:
        this micro-batch's share of the mini-batch loss (shares over micro-batches and ranks add up
        to the loss of the whole mini-batch), and scalar metrics.
    """

    needs_entropy: bool

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

    Raises:
        UnknownNameError: on construction, for a name that is not registered in this process (the
            message lists the valid ones).
    """

    policy_loss: str = "ppo_clip"
    params: dict[str, Any] = field(default_factory=dict)
    loss_agg_mode: str = "token-mean"
    norm_constant: float | None = None
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0
    kl_estimator: str = "k3"

    def __post_init__(self) -> None:
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

    def __call__(
        self,
        log_prob: torch.Tensor,
        entropy: torch.Tensor | None,
        micro_batch: Batch,
        global_tokens: float,
        global_seqs: float,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = micro_batch["response_mask"]
        aggregation = self.aggregation_fn
        norms = {
            # The function, not the name: this process's registry may not hold the name.
            "loss_agg_mode": aggregation,
            "global_token_count": global_tokens,
            "global_seq_count": global_seqs,
            "norm_constant": self.norm_constant,
        }
        loss, raw = compute_policy_loss(
            self.policy_loss_fn,
            log_prob,
            micro_batch["old_log_probs"],
            micro_batch["advantages"],
            mask,
            **norms,
            **self.params,
        )
        # Token-weighted so that summing over micro-batches gives the mini-batch mean.
        share = mask.sum().item() / global_tokens
        metrics = {f"actor/{k}": v.item() * share for k, v in raw.items()}
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
