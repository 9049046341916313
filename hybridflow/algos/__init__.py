"""Algorithms as pure tensor functions, selected by name from registries.

Nothing here holds state about a model or a run (except the small KL-coefficient controllers): every
function takes tensors and masks and returns tensors (and metrics). Shapes are written
``[batch, response_len]``; log-probabilities are natural-log (nats) probabilities of the SAMPLED
tokens; masks are 1 for tokens that count (a loss's mask may instead hold per-token loss weights
>= 0: see :mod:`hybridflow.algos.aggregation`).

Families and their calling conventions
--------------------------------------
* Advantage estimators, ``ADVANTAGE_ESTIMATORS``: ``fn(data, **params) -> (advantages, returns)``.
  ``data`` is mapping-like (``dict``, ``TensorDict``, ``Batch``) holding the columns the estimator
  needs (``response_mask``, ``token_level_rewards`` or ``scores``, ``values``, ``group_ids``,
  ``kl``); ``params`` are keyword-only config scalars. Taking the whole batch lets the trainer call
  every estimator the same way (:func:`compute_advantage`), while the keyword-only parameters make a
  misspelt config key an error. Built in: ``gae``, ``grpo``, ``rloo``, ``reinforce_pp``,
  ``reinforce_pp_baseline``, ``remax`` (reads ``baseline_scores``), ``opo``, ``gpg``, ``pass_at_k``.
  Group ids may be ``[batch]`` or ``[batch, 2]`` (query id, prefix id);
  baselines use the finest group (see :mod:`hybridflow.algos.grouping`).
* Policy losses, ``POLICY_LOSSES``: ``fn(log_prob, old_log_prob, advantages, response_mask, *,
  loss_agg_mode, global_token_count, global_seq_count, norm_constant, **params) -> (loss, metrics)``.
  Built in: ``ppo_clip``, ``gspo``, ``reinforce``, ``cispo``, ``sapo``, ``gmpo``, ``clip_cov``,
  ``kl_cov``.
* KL estimators, ``KL_ESTIMATORS``: ``fn(log_prob, ref_log_prob) -> kl [batch, response_len]``.
  Built in: ``k1``, ``k2``, ``k3``.
* Aggregation modes, ``AGGREGATION_MODES``: ``fn(loss_mat, mask, *, global_token_count,
  global_seq_count, norm_constant) -> scalar``. Built in: ``token-mean``, ``seq-mean-token-mean``,
  ``seq-mean-token-sum``, ``seq-mean-token-sum-norm``.
* Rollout correction (:mod:`hybridflow.algos.rollout_correction`): truncated importance weights of the
  trainer's log-probs against the rollout engine's, at ``token`` or ``sequence`` level, that multiply
  the per-token policy loss.

Adding one from a recipe
------------------------
::

    from hybridflow.algos import register_advantage_estimator

    @register_advantage_estimator("median_baseline")
    def median_baseline(data, *, eps=1e-6):
        ...
        return advantages, returns

then set ``adv_estimator: median_baseline`` in the config. The same works with
``register_policy_loss``, ``register_kl_estimator`` and ``register_aggregation_mode``. Unknown
names raise :class:`UnknownNameError` listing the valid choices.

Worker processes never import the recipe, so the actor resolves its names to functions on the
controller (``workers.config.ActorDerived.objective``) and ships the functions: hence the helpers
(``aggregate_loss``, ``compute_kl``, ``compute_policy_loss``) and every ``loss_agg_mode`` argument
take a registered name or the function itself (:meth:`Registry.resolve`).
"""

from hybridflow.algos.advantages import (
    compute_advantage,
    discounted_returns,
    gae,
    gpg,
    grpo,
    opo,
    pass_at_k,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
)
from hybridflow.algos.aggregation import (
    aggregate_loss,
    seq_mean_token_mean,
    seq_mean_token_sum,
    seq_mean_token_sum_norm,
    token_mean,
)
from hybridflow.algos.entropy import entropy_bonus, entropy_from_logits
from hybridflow.algos.grouping import GroupStats, group_index, group_stats
from hybridflow.algos.kl import apply_kl_penalty, compute_kl, kl_k1, kl_k2, kl_k3
from hybridflow.algos.kl_control import AdaptiveKLController, FixedKLController, build_kl_controller
from hybridflow.algos.masked import (
    last_valid_token_mask,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    top_fraction_mask,
    weighted_sum,
)
from hybridflow.algos.policy_losses import (
    cispo_loss,
    clip_cov_loss,
    compute_policy_loss,
    gmpo_loss,
    gspo_loss,
    kl_cov_loss,
    ppo_clip_loss,
    reinforce_loss,
    sapo_loss,
    token_covariance,
)
from hybridflow.algos.registry import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    compares_group_samples,
    register_advantage_estimator,
    register_aggregation_mode,
    register_kl_estimator,
    register_policy_loss,
)
from hybridflow.algos.rollout_correction import ROLLOUT_CORRECTION_LEVELS, rollout_correction_weights
from hybridflow.algos.value_loss import clipped_value_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "ROLLOUT_CORRECTION_LEVELS",
    "AdaptiveKLController",
    "FixedKLController",
    "GroupStats",
    "Registry",
    "UnknownNameError",
    "aggregate_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "cispo_loss",
    "clip_cov_loss",
    "clipped_value_loss",
    "compares_group_samples",
    "compute_advantage",
    "compute_kl",
    "compute_policy_loss",
    "discounted_returns",
    "entropy_bonus",
    "entropy_from_logits",
    "gae",
    "gmpo_loss",
    "gpg",
    "group_index",
    "group_stats",
    "grpo",
    "gspo_loss",
    "kl_cov_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "last_valid_token_mask",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "opo",
    "pass_at_k",
    "ppo_clip_loss",
    "register_advantage_estimator",
    "register_aggregation_mode",
    "register_kl_estimator",
    "register_policy_loss",
    "reinforce_loss",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "rloo",
    "rollout_correction_weights",
    "sapo_loss",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_covariance",
    "token_mean",
    "top_fraction_mask",
    "weighted_sum",
]
