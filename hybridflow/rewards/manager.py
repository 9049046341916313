"""`RewardManager`: scores a Batch of responses with rule-based or custom reward functions."""

from __future__ import annotations

import logging
import pickle
import time
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hybridflow.algos.masked import last_valid_token_mask
from hybridflow.protocol import Batch
from hybridflow.rewards.config import RewardConfig
from hybridflow.rewards.pool import ScoreOutcome, ScoreTask, ScoringPool
from hybridflow.rewards.registry import is_file_spec, resolve_reward_function
from hybridflow.rewards.shaping import check_shaping_arguments, get_reward_shaping

__all__ = ["REQUIRED_COLUMNS", "RewardFunctionFailingError", "RewardManager"]

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("response_text", "ground_truth", "data_source")

# Failure statuses of the pool and the metric counting each.
_FAILURE_METRICS = {"error": "reward/errors", "timeout": "reward/timeouts", "bad_type": "reward/bad_type"}
_EXAMPLES_LOGGED = 3


class RewardFunctionFailingError(RuntimeError):
    """A reward function failed on too many of its rows: on every row of its first call, or on
    ``RewardConfig.abort_failure_rate`` of its rows over its last ``RewardConfig.abort_window`` calls.
    Training on its fallback scores would learn nothing.

    Attributes:
        function: the function's key (its registered name, ``file.py:function`` or qualified name).
        most_common: the most common kind of failure, e.g. ``raised ValueError`` or ``timed out``.
    """

    def __init__(self, function: str, most_common: str, message: str) -> None:
        self.function = function
        self.most_common = most_common
        super().__init__(message)


@dataclass(frozen=True)
class _CallFailures:
    """One call's rows of one reward function: how many there were, and the failures by kind."""

    total: int
    kinds: Counter[str]
    examples: dict[str, str]


def _failure_kind(outcome: ScoreOutcome) -> str:
    if outcome.status == "timeout":
        return "timed out"
    if outcome.status == "bad_type":
        return "returned a non-number"
    exception, sep, _ = outcome.detail.partition(":")
    return f"raised {exception}" if sep and exception.isidentifier() else "failed"


# Slack on the failure share, so that 57 of 60 rows counts as 0.95 whatever the float rounding.
_RATE_SLACK = 1e-9


class _FailureWatch:
    """Per reward function, the failures of its calls; raises `RewardFunctionFailingError` when

    - its first call failed on every row (judged on its own, whatever ``window``), or
    - the failures of its latest ``window`` calls reach ``rate`` of their rows.

    ``rate=None`` switches both off.
    """

    def __init__(self, rate: float | None, window: int) -> None:
        self.rate = rate
        self.window = window
        self._calls: dict[str, deque[_CallFailures]] = {}

    def record(self, keys: Sequence[str], outcomes: Sequence[ScoreOutcome]) -> None:
        """Record one call: ``keys[i]`` is the function that scored row ``i``, with ``outcomes[i]``."""
        if self.rate is None:
            return
        for key in dict.fromkeys(keys):
            rows = [outcome for k, outcome in zip(keys, outcomes, strict=True) if k == key]
            failures = [outcome for outcome in rows if outcome.status != "ok"]
            kinds = Counter(_failure_kind(outcome) for outcome in failures)
            examples = {}
            for outcome in failures:
                examples.setdefault(_failure_kind(outcome), outcome.detail)
            first = key not in self._calls
            calls = self._calls.setdefault(key, deque(maxlen=self.window))
            calls.append(_CallFailures(len(rows), kinds, examples))
            if first and len(failures) == len(rows):
                self._abort(
                    key, calls, f"in its first call (judged on its own, whatever abort_window={self.window})"
                )
            self._check(key, calls, self.rate)

    def _check(self, key: str, calls: deque[_CallFailures], rate: float) -> None:
        if len(calls) < self.window:
            return
        failed, total = self._counts(calls)
        if failed < (rate - _RATE_SLACK) * total:
            return
        self._abort(
            key,
            calls,
            f"over its last {self.window} calls (abort_failure_rate={rate}, abort_window={self.window})",
        )

    @staticmethod
    def _counts(calls: deque[_CallFailures]) -> tuple[int, int]:
        return sum(sum(call.kinds.values()) for call in calls), sum(call.total for call in calls)

    def _abort(self, key: str, calls: deque[_CallFailures], judged: str) -> None:
        kinds: Counter[str] = sum((call.kinds for call in calls), Counter())
        failed, total = self._counts(calls)
        most_common, count = kinds.most_common(1)[0]
        example = next(call.examples[most_common] for call in calls if most_common in call.examples)
        raise RewardFunctionFailingError(
            key,
            most_common,
            f"reward function {key!r} failed on {failed} of {total} rows {judged}; most common failure "
            f"({count} rows): {most_common}, e.g. {example!r}. Fix the function, or set "
            "abort_failure_rate to None (never stops) to train on the fallback score anyway",
        )


class RewardManager:
    """Scores every row of a Batch in a pool of worker processes.

    Input columns: ``response_text`` (str, the decoded response), ``ground_truth``, ``data_source``
    (selects the function: ``config.fn_by_source``, else ``config.default_fn``), optionally
    ``extra_info`` and ``response_mask [batch, response_len]``.

    ``manager(batch)`` returns a new Batch (to be united with the input, ``batch | manager(batch)``):

    - ``scores [batch]`` float32: the function's score, or ``config.fallback_score`` for a sample whose
      function raised, ran past ``config.timeout_s`` or returned something other than a finite real
      number; then every shaping step of ``config.shaping``, in order;
    - ``token_level_scores [batch, response_len]`` float32 (only given ``response_mask``): the score at
      the last valid response token, 0 elsewhere;
    - ``reward_status`` (non-tensor): ``"ok"``, ``"error"``, ``"timeout"`` or ``"bad_type"`` per row;
    - ``meta["reward_metrics"]``: counts ``reward/errors``, ``reward/timeouts``, ``reward/bad_type``,
      ``reward/worker_restarts``, ``reward/empty_responses`` (rows whose mask is all zero: their score
      has no token to sit on), score statistics and ``reward/time_s``.

    A failing sample never stops the call; each failure is counted and the first few are logged with
    their row and error. A function that keeps failing stops the run: the call raises
    `RewardFunctionFailingError`, naming the function and its most common failure, when the function
    failed on every row of its first call, or when its failed rows over its last
    ``config.abort_window`` calls reach ``config.abort_failure_rate`` of its rows. A function whose
    first results in a call all time out is not run on the rest of that call (see
    :data:`~hybridflow.rewards.pool.HANG_ROWS`), so a hanging function costs seconds, not
    ``rows * timeout_s``. The worker pool starts on the first call and lives until :meth:`close` (or
    garbage collection); use the manager as a context manager to close it.

    Every reward function is resolved here, in the calling process, so a missing file, unknown name or
    unpicklable function fails at construction with a message naming it.
    """

    def __init__(self, config: RewardConfig | None = None) -> None:
        self.config = config or RewardConfig()
        # Function key -> what the workers receive (a function by reference, or a "file.py:name" string).
        self._functions: dict[str, Any] = {}
        self._default_key = self._add_function("default_fn", self.config.default_fn)
        self._key_by_source = {
            source: self._add_function(f"fn_by_source[{source!r}]", spec)
            for source, spec in self.config.fn_by_source.items()
        }
        self._shaping = [
            (step.name, get_reward_shaping(step.name), step.kwargs) for step in self.config.shaping
        ]
        for step in self.config.shaping:
            check_shaping_arguments(step.name, step.kwargs)
        self._pool: ScoringPool | None = None
        self._failure_watch = _FailureWatch(self.config.abort_failure_rate, self.config.abort_window)

    def _add_function(self, where: str, spec: Any) -> str:
        fn = resolve_reward_function(spec)
        key = spec if isinstance(spec, str) else f"{fn.__module__}.{fn.__qualname__}"
        if key not in self._functions:
            shipped = spec if is_file_spec(spec) else fn
            try:
                pickle.dumps(shipped)
            except Exception as error:
                raise TypeError(
                    f"reward.{where}: the reward function {key!r} cannot be sent to worker processes "
                    f"({error}); define it at the top level of an importable module or name it as "
                    "'path/to/file.py:function'"
                ) from None
            self._functions[key] = shipped
        return key

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the worker processes now rather than on the first call (no-op while they run).

        The first worker's start waits for the process server to import the main script, seconds of
        CPU; a caller that is itself waiting (on model loading, say) can run this in a thread to hide it.
        """
        if self._pool is None or self._pool.closed:
            self._pool = ScoringPool(
                self._functions, self.config.num_workers, self.config.timeout_s, self.config.kill_grace_s
            )

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the current workers (empty before the first call)."""
        return [] if self._pool is None else self._pool.pids

    # ------------------------------------------------------------------ scoring

    def __call__(self, batch: Batch) -> Batch:
        missing = [column for column in REQUIRED_COLUMNS if column not in batch]
        if missing:
            raise KeyError(f"RewardManager needs the columns {missing}; the batch has {batch.keys()}")
        if len(batch) == 0:
            raise ValueError("RewardManager cannot score an empty batch")
        started = time.perf_counter()
        sources = batch["data_source"]
        extra_info = batch["extra_info"] if "extra_info" in batch else [None] * len(batch)
        tasks = [
            ScoreTask(self._key_by_source.get(source, self._default_key), source, text, truth, extra)
            for source, text, truth, extra in zip(
                sources, batch["response_text"], batch["ground_truth"], extra_info, strict=True
            )
        ]
        self.start()
        restarts_before = self._pool.restarts
        outcomes = self._pool.score(tasks)

        fallback = float(self.config.fallback_score)
        raw = torch.tensor([o.score if o.status == "ok" else fallback for o in outcomes], dtype=torch.float32)
        metrics = self._failure_metrics(outcomes, sources)
        metrics["reward/worker_restarts"] = float(self._pool.restarts - restarts_before)
        self._failure_watch.record([task.fn_key for task in tasks], outcomes)

        scores = raw
        for name, fn, kwargs in self._shaping:
            shaped = fn(scores, batch, **kwargs)
            if not isinstance(shaped, torch.Tensor) or shaped.shape != scores.shape:
                raise TypeError(
                    f"reward shaping {name!r} must return a tensor of shape {tuple(scores.shape)}, got "
                    f"{getattr(shaped, 'shape', type(shaped).__name__)}"
                )
            shaped = shaped.to(torch.float32)
            metrics[f"reward/shaping/{name}_delta_mean"] = (shaped - scores).mean().item()
            scores = shaped

        tensors = {"scores": scores}
        if "response_mask" in batch:
            mask = batch["response_mask"]
            last = last_valid_token_mask(mask)
            tensors["token_level_scores"] = last.to(torch.float32) * scores.unsqueeze(-1)
            empty = int((~mask.bool().any(dim=-1)).sum())
            metrics["reward/empty_responses"] = float(empty)
            if empty:
                logger.warning("reward: %d responses are empty; their scores have no token to sit on", empty)

        metrics.update(_score_statistics(scores, raw, sources, shaped=bool(self._shaping)))
        metrics["reward/time_s"] = time.perf_counter() - started
        statuses = np.array([o.status for o in outcomes], dtype=object)
        return Batch(tensors, {"reward_status": statuses}, {"reward_metrics": metrics})

    def _failure_metrics(self, outcomes: list[ScoreOutcome], sources: np.ndarray) -> dict[str, float]:
        counts = Counter(o.status for o in outcomes)
        metrics = {name: float(counts[status]) for status, name in _FAILURE_METRICS.items()}
        failed = [i for i, o in enumerate(outcomes) if o.status != "ok"]
        if failed:
            examples = "; ".join(
                f"row {i} (data_source {sources[i]!r}) {outcomes[i].status}: {outcomes[i].detail}"
                for i in failed[:_EXAMPLES_LOGGED]
            )
            logger.warning(
                "reward: %d of %d samples got fallback_score=%s (errors %d, timeouts %d, bad_type %d); %s",
                len(failed),
                len(outcomes),
                self.config.fallback_score,
                counts["error"],
                counts["timeout"],
                counts["bad_type"],
                examples,
            )
        return metrics


def _score_statistics(
    scores: torch.Tensor, raw: torch.Tensor, sources: np.ndarray, shaped: bool
) -> dict[str, float]:
    stats = {
        "reward/score_mean": scores.mean().item(),
        "reward/score_min": scores.min().item(),
        "reward/score_max": scores.max().item(),
    }
    if shaped:
        stats["reward/raw_score_mean"] = raw.mean().item()
    for source in sorted(set(sources.tolist())):
        rows = torch.from_numpy(sources == source)
        stats[f"reward/score_mean/{source}"] = scores[rows].mean().item()
    return stats
