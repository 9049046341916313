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

``transfer/to_actor_bytes`` counts the tensor bytes these steps send the actor workers.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.algos import apply_kl_penalty, compute_advantage, compute_kl, masked_mean
from hybridflow.contract import (
    LOG_PROB_COLUMNS,
    LOSS_MASK,
    MODEL_INPUTS,
    SAMPLED_MASK,
    loss_response_mask,
    require_columns,
    step_columns,
)
from hybridflow.parallel import TokenStatistic, resolve_token_statistics
from hybridflow.protocol import Batch
from hybridflow.rollout.concat import PROMPT_COLUMNS, concat_rollouts
from hybridflow.rollout.config import RolloutConfig, ValSamplingConfig
from hybridflow.rollout.partial import derived_seed, response_columns, round_calls, run_round, take_output
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.row_order import balanced_update_order
from trainer.config import AlgorithmConfig
from trainer.rollout_queue import InFlight, PartialPool, PendingRound, staleness_metrics
from trainer.runtime import Runtime
from trainer.weight_sync import push_weights
from workers.objective import ActorLoss

__all__ = [
    "GENERATED_METRIC",
    "POOL_IDLE_S",
    "PROMPT_COLUMNS",
    "TRANSFER_METRIC",
    "actor_batch",
    "add_group_ids",
    "advantages",
    "compute_advantages",
    "concat_rollouts",
    "decode_responses",
    "generate",
    "generate_on_pool",
    "generate_partial",
    "kl_in_reward",
    "old_log_probs",
    "ref_log_probs",
    "reward_scores",
    "sampling_from",
    "sampling_params",
    "score",
    "sync_rollout",
    "teacher_log_probs",
    "update_actor",
    "update_columns",
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
POOL_IDLE_S = "async/pool_idle_s"
"""Seconds a rollout pool of its own had no work before the step's generation calls (summed over them)."""
_POOL_IDLE_REPORT = "rollout/idle_s"
"""The key of a pool generation's ``rollout_metrics`` with those seconds before it (`RolloutWorker`)."""


def _add(runtime: Runtime, metric: str, amount: float) -> None:
    runtime.record({metric: runtime.step_metrics.get(metric, 0.0) + amount})


def _counted(runtime: Runtime, batch: Batch) -> Batch:
    """``batch``, its tensor bytes added to this step's ``transfer/to_actor_bytes``."""
    _add(runtime, TRANSFER_METRIC, batch.nbytes())
    return batch


def actor_batch(runtime: Runtime, rollouts: Batch, *columns: str) -> Batch:
    """The ``columns`` of ``rollouts`` to send the actor workers, counted in ``transfer/to_actor_bytes``."""
    return _counted(runtime, rollouts.select(*columns, meta=False))


def sampling_from(section: RolloutConfig | ValSamplingConfig, runtime: Runtime, seed: int) -> SamplingParams:
    """Sampling with a config section's ``n``, ``temperature``, ``top_p`` and ``top_k``, up to
    ``data.max_response_length`` new tokens, seeded with ``seed``."""
    return SamplingParams(
        n=section.n,
        temperature=section.temperature,
        top_p=section.top_p,
        top_k=section.top_k,
        max_new_tokens=runtime.config.data.max_response_length,
        seed=seed,
    )


def sampling_params(runtime: Runtime, step: int | None = None) -> SamplingParams:
    """The configured training sampling of ``step`` (default: the current step), seeded per step so a
    resumed run samples what the uninterrupted run sampled."""
    rollout = runtime.config.rollout
    return sampling_from(rollout, runtime, (rollout.seed + (runtime.step if step is None else step)) % 2**31)


@step_columns(
    reads=("input_ids", "attention_mask"),
    writes=("responses", "response_mask", "rollout_log_probs", "group_ids", "response_text"),
)
def generate(runtime: Runtime, prompts: Batch, sampling: SamplingParams | None = None) -> Batch:
    """Sample ``sampling.n`` responses per prompt (default: the configured sampling of this step) in the
    inference layout; adds ``group_ids`` (one group per prompt) and the decoded ``response_text``, and
    counts the response tokens in ``response/generated_tokens``.

    Rows come ``n`` consecutive per prompt, the prompt columns repeated. The layout switches' timing and
    memory are recorded as ``resharding/*`` and ``timing_s/generate*``. With the rollout on a pool of its
    own (`generate_on_pool`), the actor's current weights are pushed to its engines first, each row
    carries the ``policy_version`` it was sampled with, and with ``async_rollout.max_staleness > 0`` the
    rows are those the pool generated ahead, while earlier steps trained. With
    ``async_rollout.partial_round_tokens > 0`` the rows are those of the oldest prompts whose samples
    finished, possibly started in earlier steps (`generate_partial`).
    """
    if runtime.config.async_rollout.partial_round_tokens:
        return generate_partial(runtime, prompts, sampling)
    if runtime.rollout is not runtime.actor:
        rollouts = generate_on_pool(runtime, prompts, sampling)
    else:
        with runtime.timer.phase("generation"):
            rollouts = runtime.actor.generate_sequences(
                _counted(runtime, prompts), sampling or sampling_params(runtime)
            )
    runtime.record(rollouts.meta.pop("rollout_metrics"))
    _add(runtime, GENERATED_METRIC, float(rollouts["response_mask"].sum()))
    n = len(rollouts) // len(prompts)
    return rollouts | add_group_ids(rollouts, n) | decode_responses(rollouts, runtime.tokenizer)


def generate_partial(runtime: Runtime, prompts: Batch, sampling: SamplingParams | None = None) -> Batch:
    """Partial rollouts (``async_rollout.partial_round_tokens = R > 0``): start ``prompts``' samples,
    then run generation rounds of at most ``R`` new tokens per sample
    (`hybridflow.rollout.partial.run_round`) until ``data.train_batch_size`` prompts have all their
    samples finished; returns those prompts' rows (the oldest first), as `generate` does, plus
    ``token_versions [rows, response_len]``.

    Colocated, the first step of a run (fresh or resumed: the pool is empty) also starts the stream's
    next batch, so that prompts are left running while a step trains; every step runs at least one
    round. Samples still running stay in ``runtime.rollouts_ahead.partial`` and go on in the next steps,
    on the weights of those steps, their prefix fed back as prompt. Every token carries the policy
    version (actor updates so far) of the weights that sampled it. Bound: the samples of a prompt
    started ``async_rollout.max_staleness`` versions ago get no round budget and run to the end in this
    step, so no token trains more than that many versions stale (`staleness_metrics` checks it). The
    prompts started and not yet trained are held in the prompt stream, so a checkpoint lists them, and a
    checkpoint keeps their samples so far: a resumed run's pool holds them again and its steps continue
    them (`trainer.rollout_queue.PartialPool.state_dict`, `trainer.runtime.Runtime.resume`).

    With the rollout on a pool of its own the rounds stream (`_collect_round`, `_submit_round`): a step
    first collects the round the step before left running on the pool during its update, then pushes
    the actor's weights, runs blocking rounds only while prompts are due or fewer than
    ``train_batch_size`` are complete, and after taking its prompts submits one more round, over the
    samples still running and the stream's next batch, without waiting for it. ``prompts`` must then be
    that batch (the one `Runtime.next_prompts` hands out next). The first step of a run starts
    ``min(2, max_staleness)`` batches, so that prompts started at one version never outnumber the steps
    that may still train them. A second call in one step, or ``prompts`` of another size than
    ``data.train_batch_size``, is refused with a ``ValueError`` (`_refuse_extra_generation`).

    Records ``partial/rounds`` (the collected round included), ``partial/resumed_samples``
    (continuations of a paused sample, over those rounds), ``partial/due_samples`` (samples run to the
    end by the bound), ``partial/paused_samples`` and ``partial/pending_prompts`` (left for later
    steps), the ``async/*`` staleness by token, and each blocking round's ``rollout_metrics`` (their
    ``timing_s/generate*`` summed); streaming, also ``async/trainer_wait_s`` and
    ``async/pool_generate_s`` of the collected round.
    """
    settings = runtime.config.async_rollout
    # Prompts are held and resumed by dataset index: a step that builds its own prompts cannot pause them.
    require_columns(prompts, ("index",), "generate with async_rollout.partial_round_tokens > 0")
    sampling = sampling or sampling_params(runtime)
    pool = runtime.rollouts_ahead.partial
    split = runtime.rollout is not runtime.actor
    wanted = runtime.config.data.train_batch_size
    _refuse_extra_generation(runtime, pool, len(prompts), wanted)
    pool.generated_in_step = runtime.step
    pad = runtime.tokenizer.pad_token_id
    admitted = pool.pending.admitted if pool.pending is not None else None
    if admitted is not None and prompts is not admitted:
        raise ValueError(
            "async_rollout.partial_round_tokens with the rollout on a pool of its own: generate takes the "
            "prompt batches in the order runtime.next_prompts hands them out, unchanged; this step passed a "
            "batch the rollout pool was not given (the round left running started the stream's next batch)"
        )
    rounds = resumed = generated = 0
    if pool.pending is not None:
        resumed, generated = _collect_round(runtime, pool)
        rounds = 1
    version = sync_rollout(runtime) if split else runtime.actor.policy_version()[0]
    starting = [] if admitted is not None else [prompts]
    if admitted is not None:
        runtime.prompts.hold(admitted)  # started by the round the step before left running
    elif not len(pool) and (not split or settings.max_staleness > 1):
        # The first step of a run (or of a resumed one) starts a second batch too: the step trains the
        # first batch's prompts that finish and the second batch's, and from then on every step starts a
        # batch and trains one, so that prompts are always left to go on while a step trains. Streaming,
        # the step's own round starts one batch more at this version: a second here would leave more
        # prompts of version 0 than the steps up to version max_staleness = 1 train.
        starting.append(runtime.next_prompts())
    for batch in starting:
        pool.start(batch, sampling.n, version)
        runtime.prompts.hold(batch)
    seconds: dict[str, float] = {}

    def engine_call(batch: Batch, call: SamplingParams) -> Batch:
        out = runtime.rollout.generate_sequences(_counted(runtime, batch), call)
        metrics = out.meta.pop("rollout_metrics")
        for key in [k for k in metrics if k.startswith("timing_s/generate")]:
            seconds[key] = seconds.get(key, 0.0) + metrics.pop(key)
        if split:
            _add(runtime, POOL_IDLE_S, metrics.pop(_POOL_IDLE_REPORT))
        runtime.record(metrics)
        return out

    forced = blocking = 0
    with runtime.timer.phase("generation"):
        while True:
            due, rest = pool.unfinished(version, settings.max_staleness)
            # Colocated, at least one round: the prompts started last go on even when enough have
            # finished before. Streaming, the round left running during the update did that.
            if not due and pool.complete() >= wanted and (blocking or split or not rest):
                break
            forced += len(due)
            for kind, (samples, budget) in enumerate(((due, None), (rest, settings.partial_round_tokens))):
                if samples:
                    seed = None if sampling.seed is None else derived_seed(sampling.seed, blocking, kind)
                    call = replace(sampling, seed=seed)
                    report = run_round(engine_call, samples, call, budget, version, pad)
                    resumed += report.resumed
                    generated += report.generated_tokens
            blocking += 1
    groups = pool.take(wanted)
    runtime.prompts.release([group.index for group in groups])
    rows = concat_rollouts(
        [
            group.prompt.repeat(sampling.n) | response_columns(group.samples, sampling.max_new_tokens, pad)
            for group in groups
        ],
        pad,
    )
    if split and runtime.step < runtime.total_steps:
        _submit_round(runtime, pool, sampling, version)
    paused = [sample for group in pool.groups for sample in group.samples if sample.token_ids and not sample.finished]
    runtime.record(
        {
            **seconds,
            **staleness_metrics(rows, version, settings.max_staleness, runtime.step_metrics),
            "partial/rounds": float(rounds + blocking),
            "partial/resumed_samples": float(resumed),
            "partial/due_samples": float(forced),
            "partial/paused_samples": float(len(paused)),
            "partial/pending_prompts": float(len(pool)),
        }
    )
    _add(runtime, GENERATED_METRIC, float(generated))
    return rows | add_group_ids(rows, sampling.n) | decode_responses(rows, runtime.tokenizer)


def _refuse_extra_generation(runtime: Runtime, pool: PartialPool, prompts: int, wanted: int) -> None:
    """The bound of partial rollouts rests on one batch started and one trained per step: a step that
    generates twice (dynamic sampling, a second phase) or starts more or fewer prompts (over-sampling)
    would leave more prompts due in a later step than it trains, and a token past
    ``async_rollout.max_staleness``. Refused here, before anything starts, with a ``ValueError``
    (``wanted``: ``data.train_batch_size``)."""
    key = f"async_rollout.partial_round_tokens={runtime.config.async_rollout.partial_round_tokens}"
    if pool.generated_in_step == runtime.step:
        raise ValueError(
            f"{key}: step {runtime.step} called generate a second time; partial rollouts start one batch and "
            "train one batch a step, which is what keeps async_rollout.max_staleness (a step that generates "
            "more than once, such as dynamic sampling, runs without partial rollouts)"
        )
    if prompts != wanted:
        raise ValueError(
            f"{key}: generate was given {prompts} prompts; partial rollouts start data.train_batch_size="
            f"{wanted} a step (the batch runtime.next_prompts hands out), which is what keeps "
            "async_rollout.max_staleness"
        )


_STREAMED_ROUND = 2
"""The key that seeds a round left running on the pool apart from the step's blocking rounds (0, 1)."""


def _submit_round(runtime: Runtime, pool: PartialPool, sampling: SamplingParams, version: int) -> None:
    """Start one round of ``async_rollout.partial_round_tokens`` on the rollout pool, without waiting:
    over every unfinished sample of ``pool`` and the prompt stream's next batch, which it starts at
    ``version`` (the one the pool serves) unless a resumed stream still owes held prompts (the next
    step then starts its prompts itself). The batch is only peeked (the next step is handed it by
    `Runtime.next_prompts`); a checkpoint written while the round runs waits for the round and keeps its
    samples, counting the batch as handed out (`trainer.runtime.Runtime.save_checkpoint`)."""
    admitted = None if runtime.prompts.owes else runtime.prompts.peek(0)
    if admitted is not None:
        pool.start(admitted, sampling.n, version)
    live = [sample for group in pool.groups for sample in group.samples if not sample.finished]
    seed = None if sampling.seed is None else derived_seed(sampling.seed, 0, _STREAMED_ROUND)
    budget = runtime.config.async_rollout.partial_round_tokens
    calls = round_calls(live, replace(sampling, seed=seed), budget, runtime.tokenizer.pad_token_id)
    submitted = [
        (call, runtime.rollout.generate_sequences.submit(_counted(runtime, call.prompts), call.sampling))
        for call in calls
    ]
    pool.pending = PendingRound(submitted, version, admitted, sampling.max_new_tokens)


def _collect_round(runtime: Runtime, pool: PartialPool) -> tuple[int, int]:
    """Wait for the round the step before left running (`_submit_round`) and add its tokens to their
    samples, stamped with the version the pool served for it; returns the samples it resumed and the
    tokens it generated. The wait is timed as the ``rollout_wait`` phase and recorded as
    ``async/trainer_wait_s`` (about 0 after a checkpoint, which waited for the round), the pool's own
    seconds for the round as ``async/pool_generate_s``."""
    pending = pool.pending
    assert pending is not None
    pool.pending = None
    generated = 0
    busy = 0.0
    started = time.perf_counter()
    with runtime.timer.phase("rollout_wait"):
        outputs = pending.outputs()
    for (call, _), out in zip(pending.calls, outputs, strict=True):
        require_columns(out, _POOL_WRITES, "rollout.generate_sequences", produced=True)
        busy += out.meta["rollout_metrics"]["timing_s/generate"]
        _add(runtime, POOL_IDLE_S, out.meta["rollout_metrics"][_POOL_IDLE_REPORT])
        generated += take_output(call.samples, out, pending.version, pending.cap)
    runtime.record({"async/trainer_wait_s": time.perf_counter() - started, "async/pool_generate_s": busy})
    return sum(call.resumed for call, _ in pending.calls), generated


def generate_on_pool(runtime: Runtime, prompts: Batch, sampling: SamplingParams | None = None) -> Batch:
    """``prompts``' rollouts from a rollout pool of its own, generated up to ``async_rollout.max_staleness``
    batches ahead of the trainer (`trainer.rollout_queue`).

    When the pool holds no batch (staleness 0, the first step, a resumed run), the engines are brought
    to the actor's version and given ``prompts``. Otherwise the oldest batch in flight must be
    ``prompts`` (the same object `Runtime.next_prompts` handed out). After collecting it, the weights of
    the updates since the last push go to the engines and the prompt stream's next batches are
    admitted, each with the sampling of the step that will train it, until ``k =
    async_rollout.max_staleness`` are in flight: the pool samples step ``t + 1`` while step ``t``
    trains. Admission stops at ``k`` ahead and at ``trainer.total_steps``; nothing is dropped.

    The pool is refilled only once it has handed over every batch it held, since a push waits for the
    engines' queued generations: with ``k = 1`` that is every step; with ``k > 1`` the pool takes ``k``
    batches at a time, all on the version of the step that admits them, which the ``k``-th step after
    trains at staleness ``k``.

    Records ``async/*`` (`trainer.rollout_queue.staleness_metrics`, ``async/trainer_wait_s``,
    ``async/in_flight``, ``async/pool_generate_s``) and times the wait as the ``generation`` phase at
    staleness 0, else as ``rollout_wait`` (the engines' own seconds are ``timing_s/generate``).
    """
    queue = runtime.rollouts_ahead
    ahead = queue.max_staleness
    version: int | None = None
    if not len(queue):
        version = sync_rollout(runtime)
        _admit(runtime, prompts, runtime.step, sampling or sampling_params(runtime))
    with runtime.timer.phase("rollout_wait" if ahead else "generation"):
        rollouts, waited = queue.take(prompts, sampling)
    require_columns(rollouts, _POOL_WRITES, "rollout.generate_sequences", produced=True)
    if not len(queue):
        # The pool is idle: the weights of the updates since the last push go out (a push waits for
        # the batches the pool holds), then the next batches are admitted.
        version = version if version is not None else sync_rollout(runtime)
        _fill(runtime)
    if version is None:
        version = runtime.actor.policy_version()[0]
    _add(runtime, POOL_IDLE_S, rollouts.meta["rollout_metrics"].pop(_POOL_IDLE_REPORT))
    runtime.record(
        {
            **staleness_metrics(rollouts, version, ahead, runtime.step_metrics),
            "async/trainer_wait_s": runtime.step_metrics.get("async/trainer_wait_s", 0.0) + waited,
            "async/in_flight": float(len(queue)),
            "async/pool_generate_s": runtime.step_metrics.get("async/pool_generate_s", 0.0)
            + rollouts.meta["rollout_metrics"]["timing_s/generate"],
        }
    )
    return rollouts


_POOL_WRITES = ("responses", "response_mask", "rollout_log_probs", "policy_version")
"""What a batch from the pool must hold (a submitted call returns unchecked)."""


def _admit(runtime: Runtime, prompts: Batch, step: int, sampling: SamplingParams) -> None:
    future = runtime.rollout.generate_sequences.submit(_counted(runtime, prompts), sampling)
    runtime.rollouts_ahead.admit(InFlight(prompts, step, sampling, future))


def _fill(runtime: Runtime) -> None:
    """Admit the prompt stream's next batches until ``async_rollout.max_staleness`` are in flight (none
    past ``trainer.total_steps``); each is sampled as its own step would be."""
    queue = runtime.rollouts_ahead
    while len(queue) < queue.max_staleness and (step := runtime.step + len(queue) + 1) <= runtime.total_steps:
        prompts = runtime.prompts.peek(len(queue))
        _admit(runtime, prompts, step, sampling_params(runtime, step))


def sync_rollout(runtime: Runtime) -> int:
    """With the rollout on a pool of its own, bring its engines to the actor's current policy version
    (`trainer.weight_sync.push_weights`), timed as the ``weight_push`` phase, its ``weight_push/*`` and
    ``rollout/*`` metrics recorded; returns that version. The push waits for the generation the pool is
    running: the engines take it after every batch admitted before. Colocated, nothing to do (returns
    -1): the engine is fed in-process as it generates."""
    if runtime.rollout is runtime.actor:
        return -1
    with runtime.timer.phase("weight_push"):
        metrics = push_weights(runtime.actor, runtime.rollout)
    runtime.record(metrics)
    return int(metrics["rollout/policy_version"])


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


@step_columns(reads=MODEL_INPUTS, writes=("teacher_log_probs",))
def teacher_log_probs(runtime: Runtime, rollouts: Batch) -> Batch:
    """``teacher_log_probs [batch, response_len]`` (nats) of the sampled response tokens under the
    frozen teacher (the ``teacher`` section; docs/distillation.md), at the sampling temperature as
    ``ref_log_probs`` is; timed as the ``teacher`` phase."""
    if runtime.teacher is None:
        raise RuntimeError("teacher_log_probs: the run has no teacher (set the teacher section of the config)")
    with runtime.timer.phase("teacher"):
        return runtime.teacher.compute_teacher_log_prob(
            rollouts.select(*MODEL_INPUTS, meta=False), temperature=runtime.config.rollout.temperature
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


def update_columns(rollouts: Batch, loss: ActorLoss) -> tuple[str, ...]:
    """The columns `update_actor` sends the workers for ``loss``: the model inputs, ``advantages``, the
    columns ``loss.reads`` declares, and ``old_log_probs``, ``ref_log_probs``, ``rollout_log_probs``,
    ``loss_mask`` and ``sampled_mask`` when ``rollouts`` has them (``rollout_log_probs`` next to
    ``old_log_probs`` only when the loss reads it: the gap was measured against ``old_log_probs`` already).

    Raises:
        MissingColumnError: naming each declared column that ``rollouts`` lacks (``old_log_probs`` may
            be absent: one on-policy optimizer step takes them from its own forward).
        TypeError: when ``loss`` declares no ``reads`` tuple.
        ValueError: when ``loss_mask`` is malformed (`hybridflow.contract.loss_response_mask`).
    """
    reads = getattr(loss, "reads", None)
    if not isinstance(reads, tuple):
        raise TypeError(f"update_actor: loss_fn {loss!r} must declare the columns it reads as a tuple `reads`")
    require_columns(rollouts, [c for c in reads if c != "old_log_probs"], "update_actor's loss_fn")
    if LOSS_MASK in rollouts:
        loss_response_mask(rollouts)
    optional = [c for c in (*LOG_PROB_COLUMNS, LOSS_MASK, SAMPLED_MASK) if c in rollouts]
    if "old_log_probs" in rollouts and "rollout_log_probs" in optional and "rollout_log_probs" not in reads:
        optional.remove("rollout_log_probs")
    declared = [c for c in reads if c in rollouts and c not in optional]
    return (*MODEL_INPUTS, "advantages", *optional, *declared)


@step_columns(reads=(*MODEL_INPUTS, "advantages"))
def update_actor(runtime: Runtime, rollouts: Batch, loss_fn: ActorLoss | None = None) -> None:
    """One actor update (``actor.ppo_epochs`` passes of mini-batches); records ``actor/*``.

    Sends the model inputs, ``advantages`` and every column the loss declares in ``reads``
    (`workers.objective.ActorLoss`; the config's `PolicyObjective` by default), and refuses a batch
    that lacks one with a `MissingColumnError` naming it, before anything is sent. Also sends
    ``old_log_probs``, ``ref_log_probs``, ``rollout_log_probs``, ``loss_mask`` and ``sampled_mask``
    when the batch has them (``rollout_log_probs`` next to ``old_log_probs`` only when the loss reads
    it). Without ``old_log_probs`` the update must be one on-policy optimizer step, which takes them from its own
    forward (`ActorRolloutRefWorker.update_actor`). ``loss_mask [batch, response_len]`` (weights >= 0) scales
    every loss term per token (`hybridflow.contract.loss_response_mask`). ``loss_fn`` replaces the
    config's objective. Rows are sent in `balanced_update_order`, so that every rank gets a like share
    of the rows that carry advantage (the update leaves the others out where that is exact).
    """
    loss = loss_fn if loss_fn is not None else runtime.config.actor.objective()
    columns = update_columns(rollouts, loss)
    batch = rollouts.select(*columns, meta=False)
    mini_batch_size = runtime.config.actor.ppo_mini_batch_size
    batch = batch.reorder(balanced_update_order(batch, runtime.actor.world_size, mini_batch_size))
    batch = actor_batch(runtime, batch, *columns)
    with runtime.timer.phase("update"):
        metrics = runtime.actor.update_actor(
            batch, temperature=runtime.config.rollout.temperature, loss_fn=loss_fn
        )[0]
    runtime.record(metrics)
