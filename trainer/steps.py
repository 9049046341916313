"""The named steps an RL algorithm is built from, and the pure controller functions they use.

A step function (see `trainer.fit`) is a short program over these::

    def grpo_step(runtime, prompts):
        rollouts = generate(runtime, prompts)                # G samples per prompt, inference layout
        rollouts |= score(runtime, rollouts)                 # reward functions (+ reward model)
        rollouts |= advantages(runtime, rollouts)            # group-relative, on the controller
        update_actor(runtime, rollouts)                      # clipped surrogate, training layout
        return rollouts

Each step that runs on the workers times itself as a phase of the step (``timing_s/<phase>``) and records
its metrics with ``runtime.record``; `trainer.fit.fit` puts them in the step's metrics. Every step
declares the columns it reads and writes (`hybridflow.contract`): a missing column fails with the step's
name and the column's.

`generate` keeps the step's token columns on the actor workers (`workers.rollout_store`): its rollouts
carry ``rollout_ids``, and `old_log_probs`, `ref_log_probs` and `update_actor` send those ids in place of
the held columns. ``transfer/to_actor_bytes`` counts the tensor bytes these steps send the actor workers.
"""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.algos import apply_kl_penalty, compute_advantage, compute_kl, masked_mean
from hybridflow.contract import ROLLOUT_IDS, step_columns
from hybridflow.parallel import TokenStatistic, resolve_token_statistics
from hybridflow.protocol import Batch
from hybridflow.rollout.concat import PROMPT_COLUMNS, concat_rollouts
from hybridflow.rollout.sampling import SamplingParams
from trainer.config import AlgorithmConfig
from trainer.runtime import Runtime
from workers.actor import MODEL_INPUTS
from workers.objective import ActorLoss, PolicyObjective
from workers.rollout_store import HELD_COLUMNS, RolloutKeep
from workers.training import balanced_update_order

__all__ = [
    "GENERATED_METRIC",
    "MODEL_INPUTS",
    "PROMPT_COLUMNS",
    "TRANSFER_METRIC",
    "actor_batch",
    "add_group_ids",
    "advantages",
    "compute_advantages",
    "concat_rollouts",
    "decode_responses",
    "generate",
    "kl_in_reward",
    "old_log_probs",
    "ref_log_probs",
    "reward_scores",
    "sampling_params",
    "score",
    "update_actor",
    "update_critic",
    "values",
]

# ---------------------------------------------------------------------------- pure controller functions


def decode_responses(rollouts: Batch, tokenizer: PreTrainedTokenizerBase) -> Batch:
    """``response_text``: each row's generated tokens as text (special tokens dropped)."""
    rows = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(rollouts["responses"], rollouts["response_mask"], strict=True)
    ]
    return Batch(non_tensors={"response_text": tokenizer.batch_decode(rows, skip_special_tokens=True)})


def add_group_ids(rollouts: Batch, samples_per_prompt: int) -> Batch:
    """``group_ids [batch]``: the prompt each row answers (rows come interleaved, n per prompt)."""
    if len(rollouts) % samples_per_prompt:
        raise ValueError(f"{len(rollouts)} rollout rows do not split into groups of {samples_per_prompt}")
    return Batch({"group_ids": torch.arange(len(rollouts)) // samples_per_prompt})


@step_columns(reads=("old_log_probs", "ref_log_probs", "token_level_scores", "response_mask"))
def kl_in_reward(rollouts: Batch, estimator: str, coef: float) -> tuple[Batch, float]:
    """Token rewards with a KL-to-reference penalty: ``r_t - coef * kl_t`` (Ziegler et al. 2019).

    Returns the ``token_level_rewards`` column and the mean per-token KL (nats), which drives an
    adaptive coefficient.
    """
    mask = rollouts["response_mask"]
    kl = compute_kl(rollouts["old_log_probs"], rollouts["ref_log_probs"], estimator) * mask
    rewards = apply_kl_penalty(rollouts["token_level_scores"], kl, coef, mask)
    return Batch({"token_level_rewards": rewards}), masked_mean(kl, mask).item()


@step_columns(reads=("response_mask",), writes=("advantages", "returns"))
def compute_advantages(rollouts: Batch, algorithm: AlgorithmConfig) -> Batch:
    """``advantages`` and ``returns [batch, response_len]`` from the configured estimator.

    Reads ``token_level_rewards`` when present (it carries shaping and an in-reward KL penalty), else
    ``token_level_scores``; and ``response_mask``, ``group_ids`` and, for GAE, ``values``.
    """
    data = {key: rollouts[key] for key in ("response_mask", "group_ids", "values") if key in rollouts}
    reward_column = "token_level_rewards" if "token_level_rewards" in rollouts else "token_level_scores"
    if reward_column not in rollouts:
        raise KeyError(
            "compute_advantages needs column 'token_level_rewards' or 'token_level_scores'; "
            f"the batch has: {', '.join(sorted(rollouts.keys()))}"
        )
    data["token_level_rewards"] = rollouts[reward_column]
    advantages_, returns = compute_advantage(data, algorithm.adv_estimator, **algorithm.advantage_params())
    return Batch({"advantages": advantages_, "returns": returns})


# ---------------------------------------------------------------------------- steps on the workers

TRANSFER_METRIC = "transfer/to_actor_bytes"
GENERATED_METRIC = "response/generated_tokens"
"""Response tokens the engine produced in this step, over every `generate` call (rows a step drops too)."""


def _add(runtime: Runtime, metric: str, amount: float) -> None:
    runtime.record({metric: runtime.step_metrics.get(metric, 0.0) + amount})


def _counted(runtime: Runtime, batch: Batch) -> Batch:
    """``batch``, its tensor bytes added to this step's ``transfer/to_actor_bytes``."""
    _add(runtime, TRANSFER_METRIC, batch.nbytes())
    return batch


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same values in the same shape and dtype."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def actor_batch(runtime: Runtime, rollouts: Batch, *columns: str) -> Batch:
    """The ``columns`` of ``rollouts`` to send the actor workers, counted in ``transfer/to_actor_bytes``.

    Rows this step's `generate` kept on the workers go as ``rollout_ids [rows]`` plus the columns the
    workers do not hold. A held column goes along only where the controller's copy is not the generated
    one (a recipe changed it, e.g. masked truncated responses, or joined rounds to a wider prompt);
    rows the workers no longer hold go whole.
    """
    if ROLLOUT_IDS not in rollouts or not runtime.kept_rollouts.holds(rollouts[ROLLOUT_IDS]):
        return _counted(runtime, rollouts.select(*columns, meta=False))
    kept = runtime.kept_rollouts.rows(rollouts[ROLLOUT_IDS])
    sent = [c for c in columns if c not in HELD_COLUMNS or not _same(kept[c], rollouts[c])]
    return _counted(runtime, rollouts.select(ROLLOUT_IDS, *sent, meta=False))


def sampling_params(runtime: Runtime) -> SamplingParams:
    """The configured training sampling, seeded per step so a resumed run samples what the uninterrupted
    run sampled."""
    rollout = runtime.config.rollout
    return SamplingParams(
        n=rollout.n,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=runtime.config.data.max_response_length,
        seed=(rollout.seed + runtime.step) % 2**31,
    )


@step_columns(
    reads=("input_ids", "attention_mask"),
    writes=("responses", "response_mask", "rollout_log_probs", "group_ids", "response_text"),
)
def generate(runtime: Runtime, prompts: Batch, sampling: SamplingParams | None = None) -> Batch:
    """Sample ``sampling.n`` responses per prompt (default: the configured sampling of this step) in the
    inference layout; adds ``group_ids`` (one group per prompt) and the decoded ``response_text``, and
    counts the response tokens in ``response/generated_tokens``.

    The actor workers keep the rows' token columns for this step's later calls (`actor_batch`): only the
    columns the engine adds come back, with ``rollout_ids [batch*n]`` (new ids on every call of a step),
    and the prompt columns are repeated here, ``n`` consecutive rows per prompt. The layout switches'
    timing and memory are recorded as ``resharding/*`` and ``timing_s/generate*``.
    """
    sampling = sampling or sampling_params(runtime)
    store = runtime.kept_rollouts
    keep = RolloutKeep(runtime.step, store.next_id(runtime.step), store.pad_token_id, len(prompts) * sampling.n)
    with runtime.timer.phase("generation"):
        samples = runtime.actor.generate_sequences(_counted(runtime, prompts), sampling, keep)
    rollouts = prompts.repeat(sampling.n) | samples
    store.put(runtime.step, rollouts[ROLLOUT_IDS], rollouts.select(*HELD_COLUMNS, meta=False))
    runtime.record(rollouts.meta.pop("rollout_metrics"))
    _add(runtime, GENERATED_METRIC, float(rollouts["response_mask"].sum()))
    return rollouts | add_group_ids(rollouts, sampling.n) | decode_responses(rollouts, runtime.tokenizer)


def reward_scores(runtime: Runtime, rollouts: Batch) -> tuple[Batch, dict[str, float]]:
    """Score decoded ``rollouts`` (with ``response_text``): the reward functions of ``reward``, plus the
    reward model when ``reward_model`` is configured. Neither timed nor recorded (`score` is the step).

    Returns a Batch with ``scores [batch]`` and ``token_level_scores [batch, response_len]`` (the score at
    the last valid response token, 0 elsewhere), and the reward metrics. With a reward model,
    ``scores = rule_scores + reward_model.weight * rm_scores``, both columns included, and the metrics
    gain ``reward/model_mean|std|min|max`` and ``reward/model_time_s``.
    """
    scored = runtime.reward(rollouts)
    metrics = scored.meta.pop("reward_metrics")
    rule = scored.select("scores", "token_level_scores", meta=False)
    if runtime.reward_model is None:
        return rule, metrics
    settings = runtime.config.reward_model
    assert settings is not None  # the reward-model group exists only with its config section
    columns = [*MODEL_INPUTS, *(("raw_prompt", "response_text") if settings.tokenizer else ())]
    started = time.perf_counter()
    model = runtime.reward_model.compute_rm_score(rollouts.select(*columns, meta=False))
    rm_scores = model["rm_scores"].float()
    metrics.update(
        {
            "reward/model_mean": rm_scores.mean().item(),
            "reward/model_std": rm_scores.std(unbiased=False).item(),
            "reward/model_min": rm_scores.min().item(),
            "reward/model_max": rm_scores.max().item(),
            "reward/model_time_s": time.perf_counter() - started,
        }
    )
    # Both token-level columns hold their score at the last valid response token, so their weighted sum
    # holds the combined score there, as the rule scores alone do.
    return Batch(
        {
            "scores": rule["scores"] + settings.weight * rm_scores,
            "token_level_scores": rule["token_level_scores"]
            + settings.weight * model["token_level_rm_scores"].float(),
            "rule_scores": rule["scores"],
            "rm_scores": rm_scores,
        }
    ), metrics


@step_columns(reads=("response_text", "response_mask"), writes=("scores", "token_level_scores"))
def score(runtime: Runtime, rollouts: Batch) -> Batch:
    """``scores [batch]`` and ``token_level_scores [batch, response_len]`` from the reward functions (and
    the reward model, when configured; `reward_scores`), timed as the ``reward`` phase, its metrics
    recorded."""
    with runtime.timer.phase("reward"):
        scored, metrics = reward_scores(runtime, rollouts)
    runtime.record(metrics)
    return scored


@step_columns(reads=MODEL_INPUTS, writes=("old_log_probs",))
def old_log_probs(
    runtime: Runtime, rollouts: Batch, stats: tuple[str | TokenStatistic, ...] = ("log_prob",)
) -> Batch:
    """``old_log_probs [batch, response_len]`` (nats) of the sampled tokens under the current policy, in
    the training layout, plus a column for every other token statistic in ``stats`` (e.g.
    ``self_certainty``; `hybridflow.parallel.token_stats`), all from one forward.

    With the engine's ``rollout_log_probs`` in the batch, `trainer.fit` reports their gap to these
    (``sync/*``) and checks it against ``resharding.max_log_prob_gap``.
    """
    with runtime.timer.phase("log_prob"):
        return runtime.actor.compute_log_prob(
            actor_batch(runtime, rollouts, *MODEL_INPUTS),
            temperature=runtime.config.rollout.temperature,
            stats=resolve_token_statistics(stats),
        )


@step_columns(reads=MODEL_INPUTS, writes=("ref_log_probs",))
def ref_log_probs(runtime: Runtime, rollouts: Batch) -> Batch:
    """``ref_log_probs [batch, response_len]`` (nats) under the frozen reference policy."""
    with runtime.timer.phase("ref"):
        return runtime.actor.compute_ref_log_prob(
            actor_batch(runtime, rollouts, *MODEL_INPUTS), temperature=runtime.config.rollout.temperature
        )


@step_columns(reads=MODEL_INPUTS, writes=("values",))
def values(runtime: Runtime, rollouts: Batch) -> Batch:
    """``values [batch, response_len]``: the critic's value of each response position."""
    if runtime.critic is None:
        raise RuntimeError("values: the run has no critic (set the critic section of the config)")
    with runtime.timer.phase("values"):
        return runtime.critic.compute_values(rollouts.select(*MODEL_INPUTS, meta=False))


@step_columns(reads=("response_mask",), writes=("advantages", "returns"))
def advantages(runtime: Runtime, rollouts: Batch) -> Batch:
    """``advantages`` and ``returns`` from ``algorithm.adv_estimator``; first, with
    ``algorithm.use_kl_in_reward``, the KL-penalised ``token_level_rewards`` (and ``kl/*`` metrics)."""
    algorithm = runtime.config.algorithm
    with runtime.timer.phase("advantage"):
        if runtime.kl_ctrl is None:
            return compute_advantages(rollouts, algorithm)
        penalised, mean_kl = kl_in_reward(rollouts, algorithm.kl_penalty, runtime.kl_ctrl.value)
        runtime.record({"kl/in_reward": mean_kl, "kl/coef": runtime.kl_ctrl.value})
        runtime.kl_ctrl.update(mean_kl, len(rollouts))
        return penalised | compute_advantages(rollouts | penalised, algorithm)


@step_columns(reads=(*MODEL_INPUTS, "values", "returns"))
def update_critic(runtime: Runtime, rollouts: Batch) -> None:
    """One critic update on the step's ``values`` and ``returns``; records ``critic/*``."""
    if runtime.critic is None:
        raise RuntimeError("update_critic: the run has no critic (set the critic section of the config)")
    with runtime.timer.phase("critic_update"):
        runtime.record(runtime.critic.update_critic(rollouts.select(*MODEL_INPUTS, "values", "returns"))[0])


@step_columns(reads=(*MODEL_INPUTS, "advantages"))
def update_actor(runtime: Runtime, rollouts: Batch, loss_fn: ActorLoss | None = None) -> None:
    """One actor update (``actor.ppo_epochs`` passes of mini-batches); records ``actor/*``.

    Sends ``old_log_probs``, ``ref_log_probs`` and ``rollout_log_probs`` along when the batch has them
    (``rollout_log_probs`` next to ``old_log_probs`` only for a rollout correction). Without
    ``old_log_probs`` the update must be one on-policy optimizer step, which takes them from its own
    forward (`ActorRolloutRefWorker.update_actor`). ``loss_fn`` replaces the config's objective. Rows
    are sent in `balanced_update_order`, so that every rank gets a like share of the rows that carry
    advantage (the update leaves the others out where that is exact).
    """
    optional = [c for c in ("old_log_probs", "ref_log_probs", "rollout_log_probs") if c in rollouts]
    objective = loss_fn if isinstance(loss_fn, PolicyObjective) else None
    corrected = (
        objective.rollout_correction if objective else runtime.config.actor.rollout_correction
    ) != "none"
    if "old_log_probs" in rollouts and "rollout_log_probs" in optional and not corrected:
        optional.remove("rollout_log_probs")  # the gap was measured against old_log_probs already
    columns = (*MODEL_INPUTS, "advantages", *optional)
    batch = rollouts.select(*columns, *[c for c in (ROLLOUT_IDS,) if c in rollouts], meta=False)
    mini_batch_size = runtime.config.actor.ppo_mini_batch_size
    batch = batch.reorder(balanced_update_order(batch, runtime.actor.world_size, mini_batch_size))
    batch = actor_batch(runtime, batch, *columns)
    with runtime.timer.phase("update"):
        metrics = runtime.actor.update_actor(
            batch, temperature=runtime.config.rollout.temperature, loss_fn=loss_fn
        )[0]
    runtime.record(metrics)
