"""`TrainingMonitor`: reward drift, reward-hacking signals and "is it training?" diagnostics, once per step.

The loop calls ``monitor.observe(step, rollouts, metrics)`` after the update with the step's rollouts
Batch and its metrics; it returns ``monitor/*`` metrics to log. Columns read (each check skips what is
missing):

======================  ===========================  ==================================================
column                  shape                        used by
======================  ===========================  ==================================================
``scores``              ``[batch]``                  drift; equal-reward groups; accuracy (fallback)
``data_source``         non-tensor ``[batch]``       drift (one pair of windows per source)
``rule_scores``         ``[batch]``                  accuracy; reward-model divergence; malformed inputs
``rm_scores``           ``[batch]``                  reward-model divergence
``response_mask``       ``[batch, response_len]``    response length; repetition; entropy estimate;
                                                     empty responses (without ``response_text``)
``responses``           ``[batch, response_len]``    repetition (token ids)
``response_text``       non-tensor ``[batch]``       format pass rate (``format_fn``); malformed inputs
``ground_truth``        non-tensor ``[batch]``       malformed reward inputs
``group_ids``           ``[batch]``/``[batch, L]``   equal-reward groups
``finish_reason``       non-tensor ``[batch]``       truncation (``"length"``)
``rollout_log_probs``   ``[batch, response_len]``    entropy estimate when ``entropy_key`` is absent
======================  ===========================  ==================================================

Metrics read: ``entropy_key``, ``clip_frac_key`` and ``loss_key`` of the config, and
:data:`LEARNING_RATE_KEY` (the learning rate of the actor's optimizer steps).

An alarm *fires* on the first step its condition holds (again after a step without it): it is logged
with ``logging.warning`` naming the number that tripped it, and with ``stop_on_alarm`` an alarm about the
reward (:data:`ALARMS`) raises :class:`TrainingAlarm`, so the loop can save a checkpoint and stop. While the condition
holds, ``monitor/alarm/<name>`` is 1.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hybridflow.contract import sampled_response_mask
from hybridflow.metrics.drift import RewardDriftTracker
from hybridflow.metrics.monitor.config import MonitorConfig
from hybridflow.metrics.monitor.signals import (
    batch_repetition,
    equal_reward_groups,
    standardized_change,
    window_change,
)
from hybridflow.metrics.rl import sequence_scores
from hybridflow.protocol import Batch
from hybridflow.rewards.registry import resolve_reward_function

__all__ = [
    "ALARMS",
    "DIAGNOSTICS",
    "LEARNING_RATE_KEY",
    "MALFORMED_SHARE",
    "Alarm",
    "TrainingAlarm",
    "TrainingMonitor",
    "malformed_inputs",
]

logger = logging.getLogger(__name__)

ALARMS = ("drift", "length_hacking", "format_saturation", "repetition", "rm_divergence", "malformed_reward")
"""Alarms about the reward: with ``stop_on_alarm`` each raises :class:`TrainingAlarm` when it fires."""

MALFORMED_SHARE = 0.5
"""The share of a step's rows with malformed reward inputs (`malformed_inputs`) from which a step whose
rewards are all 0 counts toward the ``malformed_reward`` alarm. A hard task scores 0 everywhere with
well-formed inputs; a reward fed empty responses or empty ground truths does so with malformed ones."""

DIAGNOSTICS = (
    "zero_advantage",
    "truncation",
    "length_growth",
    "entropy_collapse",
    "clip_frac_zero",
    "clip_frac_high",
    "zero_loss",
    "not_learning",
)
"""Alarms about the update ("is it training?"): they warn and never stop the run."""

LEARNING_RATE_KEY = "actor/lr"
"""The metric holding the learning rate of the actor's optimizer steps (mean over the step's optimizer
steps). The actor's optimizer step reports it under this name whatever the loss, so it is not a key of
the config, unlike the loss's own metrics."""


@dataclass(frozen=True)
class Alarm:
    """One alarm condition holding at a step.

    ``name`` is one of :data:`ALARMS` or :data:`DIAGNOSTICS`; ``key`` tells apart alarms of one name
    that fire on their own (a drift alarm per data source); ``message`` carries the numbers.
    """

    name: str
    message: str
    key: str = ""

    @property
    def identity(self) -> str:
        return f"{self.name}/{self.key}" if self.key else self.name


class TrainingAlarm(RuntimeError):
    """Raised by :meth:`TrainingMonitor.observe` when ``stop_on_alarm`` is on and a reward
    alarm fires. ``metrics`` holds the step's ``monitor/*`` metrics, which ``observe`` could not return."""

    def __init__(self, step: int, alarms: list[Alarm], metrics: dict[str, float]) -> None:
        self.step = step
        self.alarms = tuple(alarms)
        self.metrics = metrics
        described = "; ".join(f"{alarm.name}: {alarm.message}" for alarm in alarms)
        super().__init__(f"step {step}: stopping on monitor alarm (monitor.stop_on_alarm): {described}")


_Record = dict[str, float]

_PER_SEQUENCE_MEAN_MODES = ("seq-mean-token-mean",)
"""Aggregation modes that divide each response's loss by its own length (the length bias under sparse
rewards that the ``length_growth`` diagnostic names)."""

_NO_STREAKS = {"clip_frac_zero": 0, "clip_frac_high": 0, "malformed_reward": 0}


class TrainingMonitor:
    """Watches a run step by step; see the module docstring for what it reads and how alarms fire.

    ``optimizer_steps_per_batch`` is how many actor optimizer steps each step's batch gets, as the run's
    derived sizes say (``ppo_epochs`` times the mini-batches per epoch). At 1 the one step updates the
    policy that sampled (or whose old log-probs were just computed), so the policy ratio is 1 and a zero
    clip fraction is what a healthy run shows: the ``clip_frac_zero`` alarm stays silent, and
    ``not_learning`` (a learning rate of 0) is the check that the update can move the policy. ``None``
    (not known) keeps the ``clip_frac_zero`` alarm on. ``loss_agg_mode`` is the actor's
    ``actor.loss_agg_mode``: the ``length_growth`` diagnostic names it as the likely cause when it
    divides each response's loss by its own length (``None``: not known).

    State (the drift windows, the last ``trend_window`` steps' signals, clip-fraction streaks, the
    alarms holding) survives a resume through :meth:`state_dict` / :meth:`load_state_dict`.
    """

    def __init__(
        self,
        config: MonitorConfig | None = None,
        *,
        optimizer_steps_per_batch: int | None = None,
        loss_agg_mode: str | None = None,
    ) -> None:
        if optimizer_steps_per_batch is not None and optimizer_steps_per_batch < 1:
            raise ValueError(
                f"TrainingMonitor: optimizer_steps_per_batch must be >= 1, got {optimizer_steps_per_batch}"
            )
        self.config = config or MonitorConfig()
        self.optimizer_steps_per_batch = optimizer_steps_per_batch
        self.loss_agg_mode = loss_agg_mode
        self._drift = RewardDriftTracker(self.config.drift_window, self.config.drift_reference)
        self._history: deque[_Record] = deque(maxlen=self._history_length)
        self._streaks = dict(_NO_STREAKS)
        self._holding: set[str] = set()
        self._format_fn = None if self.config.format_fn is None else _resolve_format_fn(self.config.format_fn)

    @property
    def _history_length(self) -> int:
        return max(self.config.trend_window, self.config.length_growth_window)

    # ------------------------------------------------------------------ the step

    def observe(self, step: int, rollouts: Batch, metrics: Mapping[str, Any]) -> dict[str, float]:
        """Judge one step: its ``rollouts`` Batch and its ``metrics`` (names to numbers).

        Returns ``monitor/*`` metrics (docs/metrics.md); logs a warning for each alarm that fires and,
        with ``stop_on_alarm``, raises :class:`TrainingAlarm` if an alarm of ``ALARMS`` fired.
        """
        if not self.config.enabled:
            return {}
        out: dict[str, float] = {}
        malformed = self._malformed_reward(rollouts, out)
        alarms = [
            *self._drift_alarms(rollouts, out),
            *self._hacking_alarms(rollouts, out),
            *([malformed] if malformed is not None else []),
            *self._diagnostics(rollouts, metrics, out),
        ]
        holding = {alarm.name for alarm in alarms}
        for name in (*ALARMS, *DIAGNOSTICS):
            out[f"monitor/alarm/{name}"] = float(name in holding)
        fired = [alarm for alarm in alarms if alarm.identity not in self._holding]
        self._holding = {alarm.identity for alarm in alarms}
        for alarm in fired:
            logger.warning("step %d: %s", step, alarm.message)
        stopping = [alarm for alarm in fired if alarm.name in ALARMS]
        if stopping and self.config.stop_on_alarm:
            raise TrainingAlarm(step, stopping, out)
        return out

    # ------------------------------------------------------------------ reward drift

    def _drift_alarms(self, rollouts: Batch, out: dict[str, float]) -> list[Alarm]:
        if "scores" not in rollouts or "data_source" not in rollouts:
            return []
        config = self.config
        self._drift.add(rollouts["data_source"], rollouts["scores"])
        alarms = []
        for source, score in self._drift.scores(config.drift_bins).items():
            out[f"monitor/drift/psi/{source}"] = score.psi
            out[f"monitor/drift/ks/{source}"] = score.ks
            reasons = []
            if config.psi_threshold is not None and score.psi >= config.psi_threshold:
                reasons.append(f"PSI {score.psi:.3f} >= monitor.psi_threshold={config.psi_threshold}")
            if config.ks_threshold is not None and score.ks >= config.ks_threshold:
                reasons.append(f"KS {score.ks:.3f} >= monitor.ks_threshold={config.ks_threshold}")
            if reasons:
                message = (
                    f"reward drift on data source {source!r}: its last {config.drift_window} rewards differ "
                    f"from the {config.drift_reference} {config.drift_window} ({', '.join(reasons)})"
                )
                alarms.append(Alarm("drift", message, key=source))
        return alarms

    # ------------------------------------------------------------------ reward hacking

    def _hacking_alarms(self, rollouts: Batch, out: dict[str, float]) -> list[Alarm]:
        record = self._record(rollouts)
        self._history.append(record)
        for key, name in (("accuracy", "accuracy"), ("format", "format_rate"), ("repetition", "repetition")):
            if key in record:
                out[f"monitor/hacking/{name}"] = record[key]
        accuracy = self._window("accuracy")
        accuracy_change = None if accuracy is None else window_change(accuracy["accuracy"])
        if accuracy_change is not None:
            out["monitor/hacking/accuracy_change"] = accuracy_change
        alarms = [
            self._length_hacking(accuracy_change, out),
            self._format_saturation(accuracy_change, out),
            self._repetition(out),
            self._rm_divergence(out),
        ]
        return [alarm for alarm in alarms if alarm is not None]

    def _record(self, rollouts: Batch) -> _Record:
        """This step's values of every signal the Batch allows."""
        record: _Record = {}
        accuracy = self._accuracy(rollouts)
        if accuracy is not None:
            record["accuracy"] = accuracy
        if "response_mask" in rollouts and len(rollouts):
            # What the policy wrote: ids an environment inserted (tool output) are not its length.
            record["length"] = sampled_response_mask(rollouts).sum(-1).double().mean().item()
        if self._format_fn is not None and "response_text" in rollouts and len(rollouts):
            record["format"] = self._format_rate(rollouts)
        if "responses" in rollouts and "response_mask" in rollouts:
            repetition = batch_repetition(
                rollouts["responses"], rollouts["response_mask"], self.config.repetition_ngram
            )
            if repetition is not None:
                record["repetition"] = repetition
        if "rm_scores" in rollouts and "rule_scores" in rollouts and len(rollouts):
            for column, name in (("rm_scores", "rm"), ("rule_scores", "rule")):
                values = rollouts[column].double()
                record[f"{name}_mean"] = values.mean().item()
                record[f"{name}_var"] = values.var(correction=0).item()
        return record

    def _accuracy(self, rollouts: Batch) -> float | None:
        if not len(rollouts):
            return None
        for column in self.config.accuracy_columns:
            if column in rollouts:
                correct = rollouts[column].double() >= self.config.correct_threshold
                return correct.double().mean().item()
        return None

    def _format_rate(self, rollouts: Batch) -> float:
        assert self._format_fn is not None
        rows = len(rollouts)
        sources = rollouts["data_source"] if "data_source" in rollouts else [None] * rows
        truths = rollouts["ground_truth"] if "ground_truth" in rollouts else [None] * rows
        extras = rollouts["extra_info"] if "extra_info" in rollouts else [None] * rows
        total = 0.0
        for row, (text, source, truth, extra) in enumerate(
            zip(rollouts["response_text"], sources, truths, extras, strict=True)
        ):
            try:
                total += float(
                    self._format_fn(
                        data_source=source, solution_str=text, ground_truth=truth, extra_info=extra
                    )
                )
            except Exception as error:
                raise RuntimeError(
                    f"monitor.format_fn {self.config.format_fn!r} failed on row {row}: {error!r}"
                ) from error
        return total / rows

    def _window(self, *keys: str, steps: int | None = None) -> dict[str, list[float]] | None:
        """The last ``steps`` (default ``trend_window``) steps' values of ``keys``, if every one of those
        steps has them all."""
        steps = self.config.trend_window if steps is None else steps
        if len(self._history) < steps:
            return None
        records = list(self._history)[-steps:]
        if not all(key in record for record in records for key in keys):
            return None
        return {key: [record[key] for record in records] for key in keys}

    def _length_hacking(self, accuracy_change: float | None, out: dict[str, float]) -> Alarm | None:
        config = self.config
        window = self._window("length", "accuracy")
        if window is None or accuracy_change is None:
            return None
        mean_length = float(np.mean(window["length"]))
        rise = window_change(window["length"]) / mean_length if mean_length > 0 else 0.0
        out["monitor/hacking/length_rise"] = rise
        if config.length_rise is None or rise < config.length_rise or accuracy_change > config.accuracy_flat:
            return None
        return Alarm(
            "length_hacking",
            f"possible reward hacking: mean response length rose {rise:.0%} over the last "
            f"{config.trend_window} steps (>= monitor.length_rise={config.length_rise}) while accuracy "
            f"changed {accuracy_change:+.3f} (<= monitor.accuracy_flat={config.accuracy_flat})",
        )

    def _format_saturation(self, accuracy_change: float | None, out: dict[str, float]) -> Alarm | None:
        config = self.config
        window = self._window("format", "accuracy")
        if window is None or accuracy_change is None:
            return None
        rise = window_change(window["format"])
        now = window["format"][-1]
        out["monitor/hacking/format_change"] = rise
        if (
            config.format_rise is None
            or rise < config.format_rise
            or now < config.format_saturation
            or accuracy_change > config.accuracy_flat
        ):
            return None
        return Alarm(
            "format_saturation",
            f"possible reward hacking: the {config.format_fn!r} format reward rose {rise:+.3f} over the "
            f"last {config.trend_window} steps to {now:.3f} "
            f"(>= monitor.format_saturation={config.format_saturation}) while accuracy changed "
            f"{accuracy_change:+.3f} (<= monitor.accuracy_flat={config.accuracy_flat})",
        )

    def _repetition(self, out: dict[str, float]) -> Alarm | None:
        config = self.config
        window = self._window("repetition")
        if window is None:
            return None
        rise = window_change(window["repetition"])
        out["monitor/hacking/repetition_change"] = rise
        if config.repetition_rise is None or rise < config.repetition_rise:
            return None
        return Alarm(
            "repetition",
            f"possible reward hacking: the share of repeated {config.repetition_ngram}-grams in responses "
            f"rose {rise:+.3f} over the last {config.trend_window} steps to {window['repetition'][-1]:.3f} "
            f"(>= monitor.repetition_rise={config.repetition_rise})",
        )

    def _rm_divergence(self, out: dict[str, float]) -> Alarm | None:
        config = self.config
        window = self._window("rm_mean", "rm_var", "rule_mean", "rule_var")
        if window is None:
            return None
        rm_gain = standardized_change(window["rm_mean"], window["rm_var"])
        rule_gain = standardized_change(window["rule_mean"], window["rule_var"])
        divergence = rm_gain - rule_gain
        out["monitor/hacking/rm_rule_divergence"] = divergence
        if config.rm_divergence is None or divergence < config.rm_divergence:
            return None
        return Alarm(
            "rm_divergence",
            f"possible reward-model hacking: over the last {config.trend_window} steps the reward model's "
            f"score rose {rm_gain:+.2f} standard deviations and the rule reward's {rule_gain:+.2f} "
            f"(gap {divergence:.2f} >= monitor.rm_divergence={config.rm_divergence})",
        )

    # ------------------------------------------------------------------ malformed reward inputs

    def _malformed_reward(self, rollouts: Batch, out: dict[str, float]) -> Alarm | None:
        column = next((name for name in ("rule_scores", "scores") if name in rollouts), None)
        malformed = malformed_inputs(rollouts)
        if column is None or malformed is None or not len(rollouts):
            return None
        share = float(np.mean(malformed))
        all_zero = bool((rollouts[column] == 0).all())
        streak = self._streaks["malformed_reward"] + 1 if all_zero and share >= MALFORMED_SHARE else 0
        self._streaks["malformed_reward"] = streak
        out["monitor/reward/malformed_input_frac"] = share
        out["monitor/reward/zero_malformed_streak"] = float(streak)
        patience = self.config.malformed_reward_patience
        if patience is None or streak < patience:
            return None
        return Alarm(
            "malformed_reward",
            f"every reward ({column}) has been 0 for {streak} steps in a row (>= "
            f"monitor.malformed_reward_patience={patience}) while {share:.0%} of this step's {len(rollouts)} "
            "rows have malformed reward inputs (an empty response, or a ground truth that is missing, empty "
            "or bytes): the reward function cannot score them; check the data's ground_truth column and "
            "the responses",
        )

    # ------------------------------------------------------------------ is it training?

    def _diagnostics(self, rollouts: Batch, metrics: Mapping[str, Any], out: dict[str, float]) -> list[Alarm]:
        alarms = [
            self._zero_advantage(rollouts, out),
            self._truncation(rollouts, out),
            self._length_growth(out),
            self._entropy_collapse(rollouts, metrics, out),
            *self._clip_fraction(metrics, out),
            self._zero_loss(metrics),
            self._not_learning(metrics),
        ]
        return [alarm for alarm in alarms if alarm is not None]

    def _zero_advantage(self, rollouts: Batch, out: dict[str, float]) -> Alarm | None:
        scores = sequence_scores(rollouts)
        if scores is None or "group_ids" not in rollouts:
            return None
        equal, groups = equal_reward_groups(scores, rollouts["group_ids"])
        if not groups:
            return None
        share = equal / groups
        out["monitor/diag/equal_reward_group_frac"] = share
        limit = self.config.zero_advantage_frac
        if limit is None or share < limit:
            return None
        return Alarm(
            "zero_advantage",
            f"{equal} of {groups} prompt groups ({share:.0%}, >= monitor.zero_advantage_frac={limit}) gave "
            "every sample the same reward: their group-relative advantages are 0 and the update learns "
            "nothing from them (the prompts are too easy or too hard for the policy, or the reward is "
            "constant)",
        )

    def _truncation(self, rollouts: Batch, out: dict[str, float]) -> Alarm | None:
        if "finish_reason" not in rollouts or not len(rollouts):
            return None
        truncated = int(np.sum(np.asarray(rollouts["finish_reason"], dtype=object) == "length"))
        rate = truncated / len(rollouts)
        out["monitor/diag/truncation_rate"] = rate
        limit = self.config.truncation_frac
        if limit is None or rate < limit:
            return None
        return Alarm(
            "truncation",
            f"{truncated} of {len(rollouts)} responses ({rate:.0%}, >= monitor.truncation_frac={limit}) "
            "hit the length limit: their rewards judge unfinished answers; raise data.max_response_length "
            "or penalise overlong responses",
        )

    def _length_growth(self, out: dict[str, float]) -> Alarm | None:
        config = self.config
        window = self._window("length", "accuracy", steps=config.length_growth_window)
        if window is None:
            return None
        mean_length = float(np.mean(window["length"]))
        rise = window_change(window["length"]) / mean_length if mean_length > 0 else 0.0
        accuracy = float(np.mean(window["accuracy"]))
        out["monitor/diag/length_growth"] = rise
        if config.length_growth is None or rise < config.length_growth or accuracy > config.length_growth_accuracy:
            return None
        first, last = window["length"][0], window["length"][-1]
        return Alarm(
            "length_growth",
            f"responses grew {rise:.0%} over the last {config.length_growth_window} steps ({first:.0f} -> "
            f"{last:.0f} tokens; >= monitor.length_growth={config.length_growth}) while only {accuracy:.0%} of "
            f"samples were right (<= monitor.length_growth_accuracy={config.length_growth_accuracy}): "
            f"{self._length_growth_cause()}",
        )

    def _length_growth_cause(self) -> str:
        """The likely cause of length growing without reward, and the keys that change it."""
        remedies = (
            "add DAPO's soft overlong punishment (reward.shaping: [{name: overlong_penalty, kwargs: "
            "{max_response_length: ..., cache_length: ...}}]), lower actor.lr, or give the group more "
            "chances of a right answer (rollout.n, an easier data mix)"
        )
        if self.loss_agg_mode in _PER_SEQUENCE_MEAN_MODES:
            return (
                f"likely the length bias of actor.loss_agg_mode={self.loss_agg_mode}, which divides each "
                "response's loss by its own length: a long wrong answer is pushed down less per token than a "
                "short one, and when most rewards are 0 that bias is most of the gradient (Dr. GRPO, "
                "arXiv:2503.20783). Set actor.loss_agg_mode=token-mean (DAPO) or seq-mean-token-sum-norm "
                f"(Dr. GRPO); also {remedies}"
            )
        return f"rewards too sparse for the groups to tell answers apart; {remedies}"

    def _entropy_collapse(
        self, rollouts: Batch, metrics: Mapping[str, Any], out: dict[str, float]
    ) -> Alarm | None:
        entropy = self._entropy(rollouts, metrics)
        if entropy is None:
            return None
        what = (
            self.config.entropy_key
            if self.config.entropy_key in metrics
            else "the sampled tokens' mean negative log-prob (an entropy estimate)"
        )
        out["monitor/diag/entropy"] = entropy
        floor = self.config.entropy_floor
        if floor is None or entropy >= floor:
            return None
        return Alarm(
            "entropy_collapse",
            f"entropy has collapsed: {what} is {entropy:.4f} nats per token "
            f"(< monitor.entropy_floor={floor}); samples of a prompt are near-identical, so groups stop "
            "carrying signal",
        )

    def _entropy(self, rollouts: Batch, metrics: Mapping[str, Any]) -> float | None:
        """The ``entropy_key`` metric, else ``-mean(rollout_log_probs)`` over the sampled tokens (nats).

        For tokens sampled from the policy, the mean negative log-prob estimates its entropy.
        """
        if self.config.entropy_key in metrics:
            return float(metrics[self.config.entropy_key])
        if "rollout_log_probs" not in rollouts or "response_mask" not in rollouts:
            return None
        sampled = rollouts["rollout_log_probs"][sampled_response_mask(rollouts)]
        return None if sampled.numel() == 0 else -sampled.double().mean().item()

    def _clip_fraction(self, metrics: Mapping[str, Any], out: dict[str, float]) -> list[Alarm]:
        config = self.config
        key = config.clip_frac_key
        if key not in metrics:
            return []
        value = float(metrics[key])
        streaks = self._streaks
        streaks["clip_frac_zero"] = streaks["clip_frac_zero"] + 1 if value <= config.clip_frac_low else 0
        streaks["clip_frac_high"] = streaks["clip_frac_high"] + 1 if value >= config.clip_frac_high else 0
        out["monitor/diag/clip_frac_zero_streak"] = float(streaks["clip_frac_zero"])
        out["monitor/diag/clip_frac_high_streak"] = float(streaks["clip_frac_high"])
        patience = config.clip_patience
        # One optimizer step per batch: the ratio is 1 by construction, so a zero streak says nothing.
        zero_expected = self.optimizer_steps_per_batch == 1
        alarms = []
        if patience is not None and not zero_expected and streaks["clip_frac_zero"] >= patience:
            alarms.append(
                Alarm(
                    "clip_frac_zero",
                    f"{key} has been <= monitor.clip_frac_low={config.clip_frac_low} for "
                    f"{streaks['clip_frac_zero']} steps (now {value:.3g}): the policy ratio never leaves "
                    "the clip range: the updates barely move the policy (learning rate too small?)",
                )
            )
        if patience is not None and streaks["clip_frac_high"] >= patience:
            alarms.append(
                Alarm(
                    "clip_frac_high",
                    f"{key} has been >= monitor.clip_frac_high={config.clip_frac_high} for "
                    f"{streaks['clip_frac_high']} steps (now {value:.3g}): almost every token is clipped, "
                    "so the policy moves too far per update (lower the learning rate or take fewer "
                    "optimizer steps per batch)",
                )
            )
        return alarms

    def _zero_loss(self, metrics: Mapping[str, Any]) -> Alarm | None:
        key = self.config.loss_key
        if not self.config.warn_zero_loss or key not in metrics or float(metrics[key]) != 0.0:
            return None
        return Alarm(
            "zero_loss",
            f"{key} is exactly 0: no token carried a policy-gradient signal this step (every advantage is 0 "
            "or every response is empty)",
        )

    def _not_learning(self, metrics: Mapping[str, Any]) -> Alarm | None:
        if LEARNING_RATE_KEY not in metrics or float(metrics[LEARNING_RATE_KEY]) != 0.0:
            return None
        return Alarm(
            "not_learning",
            f"{LEARNING_RATE_KEY} is 0: this step's optimizer steps left the policy unchanged (actor.lr is 0, "
            "or a decaying schedule has run past its last step)",
        )

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything :meth:`observe` remembers between steps, as plain Python containers."""
        return {
            "drift": self._drift.state_dict(),
            "history": [dict(record) for record in self._history],
            "streaks": dict(self._streaks),
            "holding": sorted(self._holding),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict` of a monitor with the same config."""
        self._drift.load_state_dict(state["drift"])
        self._history = deque((dict(record) for record in state["history"]), maxlen=self._history_length)
        # States saved before an alarm existed lack its streak: it starts at 0.
        self._streaks = {**_NO_STREAKS, **state["streaks"]}
        self._holding = set(state["holding"])


def malformed_inputs(rollouts: Batch) -> list[bool] | None:
    """Per row, whether its reward inputs look malformed: an empty response (blank ``response_text``,
    else no token under ``response_mask``) or a ground truth that is missing (None), blank text, an empty
    list or mapping, or bytes. None when the Batch has neither responses nor ground truths."""
    rows = len(rollouts)
    empty: list[bool] | None = None
    if "response_text" in rollouts:
        empty = [not str(text).strip() for text in rollouts["response_text"]]
    elif "response_mask" in rollouts:
        empty = (rollouts["response_mask"].sum(-1) == 0).tolist()
    truths = [_malformed_truth(truth) for truth in rollouts["ground_truth"]] if "ground_truth" in rollouts else None
    if empty is None and truths is None:
        return None
    return [a or b for a, b in zip(empty or [False] * rows, truths or [False] * rows, strict=True)]


def _malformed_truth(truth: Any) -> bool:
    if truth is None or isinstance(truth, bytes | bytearray):
        return True
    if isinstance(truth, str):
        return not truth.strip()
    if isinstance(truth, list | tuple | dict | np.ndarray):
        return len(truth) == 0
    return False


def _resolve_format_fn(spec: str) -> Callable[..., Any]:
    try:
        return resolve_reward_function(spec)
    except (KeyError, FileNotFoundError, AttributeError, ImportError, TypeError) as error:
        raise ValueError(f"monitor.format_fn: cannot resolve {spec!r}: {error}") from None
