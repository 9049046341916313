"""Worker processes that run reward functions, with a timeout per sample.

How work moves (the choice, and why):

- **Chunks out, one result back per sample.** The parent sends each idle worker a chunk of samples in
  one message (about ``len(tasks) / (4 * num_workers)`` samples, so a slow chunk cannot hold up the
  end of the batch by much). The worker scores them in order and sends each result back as soon as it
  has it. Results are pipelined: the worker never waits for the parent, so the cost per sample is one
  small pickled tuple on a pipe (tens of microseconds), not a request/response round trip through an
  executor's queues and threads.
- **Per-sample timeouts, two layers.** Inside the worker, a ``SIGALRM`` timer armed for each sample
  interrupts a function that runs past ``timeout_s`` (a sleep, a Python loop, a slow sympy call); the
  sample is reported as timed out and the worker goes on with the next one, no restart needed. Because
  results stream back one by one, the parent knows which sample is running and since when: if a
  worker sends nothing for ``timeout_s + kill_grace_s`` seconds (a function stuck in C code that never
  returns to the interpreter, or one that swallowed the alarm), the parent kills the process with
  SIGKILL, reports that sample as timed out, starts a fresh worker and hands it the rest of the chunk.
  A worker that dies (segfault, ``os._exit``) costs only the sample it was running, reported as an
  error.
- **A hanging function is judged by its first rows.** When the first ``HANG_ROWS`` (3) results of a
  function in one call are all timeouts, its other rows of the call are not run: they are reported as
  timed out at once, and the workers busy with them are replaced. A function that hangs on every row
  so costs about ``ceil(HANG_ROWS / num_workers) * (timeout_s + kill_grace_s)`` per call instead of
  ``rows * timeout_s / num_workers``. One result that is not a timeout first (a score, an error)
  clears the function for the rest of the call.
- **Setup outside the timer.** A reward function may carry a ``prepare`` attribute, a callable without
  arguments that each worker runs once before reporting ready (``math_verify`` uses it to import
  sympy, which can take seconds on a loaded machine and would otherwise eat the first sample's time).
- **Processes from a forkserver.** The forkserver is a clean process (no threads, no CUDA, no Ray
  connections of the parent), and a new worker is a fork of it: cheap enough to replace a killed one
  mid-batch. Reward functions travel to the workers by reference (a registered function by its module
  and name, a ``"file.py:function"`` entry as that string, loaded in each worker).

This module avoids importing torch so that a worker starts in a fraction of a second.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import numbers
import os
import signal
import time
import weakref
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from hybridflow.rewards.registry import resolve_reward_function

__all__ = ["HANG_ROWS", "STATUSES", "ScoreOutcome", "ScoreTask", "ScoringPool"]

logger = logging.getLogger(__name__)

STATUSES = ("ok", "error", "timeout", "bad_type")

HANG_ROWS = 3
"""A function whose first this many results in a call are all timeouts is taken as hanging for the
rest of the call (its other rows are reported as timed out without being run)."""

# (position in the call, function key, data_source, solution_str, ground_truth, extra_info)
_Payload = tuple[int, str, str, str, Any, Any]


@dataclass(frozen=True)
class ScoreTask:
    """One sample to score with the function registered in the pool under ``fn_key``."""

    fn_key: str
    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: Any = None


@dataclass(frozen=True)
class ScoreOutcome:
    """The result for one sample: ``status`` is one of :data:`STATUSES`; ``score`` is None unless ``"ok"``."""

    status: str
    score: float | None
    detail: str = ""


class _SampleTimeout(BaseException):
    """Raised by the per-sample alarm. A BaseException, so ``except Exception`` in a reward function
    cannot swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SampleTimeout


def _describe(error: BaseException) -> str:
    try:
        text = str(error)
    except Exception:
        # An exception whose __str__ itself fails must not take the worker down with it.
        text = "<message cannot be printed>"
    return f"{type(error).__name__}: {text}"[:500]


# The largest finite float32: scores travel as float32 tensors, where anything larger would be inf.
_FLOAT32_MAX = 3.4028234663852886e38


def _judge_value(value: Any) -> tuple[str, float | None, str]:
    """``("ok", score, "")`` for a finite real number within float32's range (``bool`` and numpy
    numbers included), else ``("bad_type", None, why)``: None, text, NaN, inf, a number past float32's
    range, a tensor, a list, an object whose ``__float__`` fails."""
    if not isinstance(value, numbers.Real):
        return "bad_type", None, f"returned {type(value).__name__}, not a finite real number"
    try:
        score = float(value)
    except Exception as error:
        return "bad_type", None, f"returned {type(value).__name__} that float() refuses ({_describe(error)})"
    if not math.isfinite(score):
        return "bad_type", None, f"returned {type(value).__name__} {score}, not a finite real number"
    if abs(score) > _FLOAT32_MAX:
        return (
            "bad_type",
            None,
            f"returned {type(value).__name__} {score:g}, past the float32 range of scores",
        )
    return "ok", score, ""


def _score_one(fn: Callable[..., Any], payload: _Payload, timeout_s: float) -> tuple[str, float | None, str]:
    _, _, data_source, solution_str, ground_truth, extra_info = payload
    # Set again for every sample: a reward function may have installed a handler of its own.
    signal.signal(signal.SIGALRM, _on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            value = fn(
                data_source=data_source,
                solution_str=solution_str,
                ground_truth=ground_truth,
                extra_info=extra_info,
            )
            # Inside the timer: the value's own __float__ is the function's code too.
            return _judge_value(value)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _SampleTimeout:
        return "timeout", None, f"no result within {timeout_s} s"
    except (Exception, SystemExit) as error:
        return "error", None, _describe(error)


def _worker_main(conn: Connection, functions: Mapping[str, Any], timeout_s: float) -> None:
    # Ctrl-C reaches the whole process group; the parent decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        resolved = {key: resolve_reward_function(spec) for key, spec in functions.items()}
        for fn in resolved.values():
            # Slow one-time setup (imports) runs here, so it counts against no sample's time limit.
            prepare = getattr(fn, "prepare", None)
            if callable(prepare):
                prepare()
    except Exception as error:
        conn.send(("init_error", _describe(error)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for payload in chunk:
            conn.send((payload[0], *_score_one(resolved[payload[1]], payload, timeout_s)))


class _Worker:
    """One worker process, the parent's end of its pipe, and the samples it still owes."""

    def __init__(self, ctx: Any, functions: Mapping[str, Any], timeout_s: float) -> None:
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(
            target=_worker_main,
            args=(child_conn, functions, timeout_s),
            name="hybridflow-reward",
            daemon=True,
        )
        self.process.start()
        child_conn.close()
        self.started = time.monotonic()
        self.ready = False
        self.pending: deque[_Payload] = deque()
        # When the sample now running is overdue (None while idle).
        self.deadline: float | None = None

    def stop(self, kill: bool) -> None:
        if not kill:
            # A worker that already died cannot be asked; it is reaped below either way.
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(timeout=1.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5.0)
        self.conn.close()


def _stop_workers(workers: list[_Worker]) -> None:
    for worker in workers:
        worker.stop(kill=False)


class ScoringPool:
    """``num_workers`` processes that score :class:`ScoreTask` lists; see the module docstring.

    Args:
        functions: reward function per key (any form :func:`resolve_reward_function` accepts; it is
            pickled to each worker, so a callable must be importable by module and name).
        num_workers: worker processes.
        timeout_s: time limit of one sample, in seconds, enforced inside the worker.
        kill_grace_s: extra seconds before the parent kills a worker stuck on one sample.
        start_timeout_s: how long a new worker may take to report ready.
    """

    def __init__(
        self,
        functions: Mapping[str, Any],
        num_workers: int,
        timeout_s: float,
        kill_grace_s: float,
        start_timeout_s: float = 120.0,
    ) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._functions = dict(functions)
        self.timeout_s = timeout_s
        self.kill_after_s = timeout_s + kill_grace_s
        self.start_timeout_s = start_timeout_s
        self.restarts = 0
        self._workers: list[_Worker] = []
        # Stops the workers when the pool is garbage-collected or the interpreter exits.
        self._finalizer = weakref.finalize(self, _stop_workers, self._workers)
        for _ in range(num_workers):
            self._workers.append(_Worker(self._ctx, self._functions, timeout_s))

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def pids(self) -> list[int | None]:
        """Process ids of the current workers."""
        return [worker.process.pid for worker in self._workers]

    def close(self) -> None:
        """Stop every worker (idempotent)."""
        self._finalizer()

    def score(self, tasks: Sequence[ScoreTask]) -> list[ScoreOutcome]:
        """One outcome per task, in order. Never raises for a sample's failure; raises RuntimeError
        only when a worker cannot start at all."""
        if self.closed:
            raise RuntimeError("the scoring pool is closed")
        payloads = [
            (i, t.fn_key, t.data_source, t.solution_str, t.ground_truth, t.extra_info)
            for i, t in enumerate(tasks)
        ]
        size = max(1, math.ceil(len(payloads) / (4 * len(self._workers))))
        call = _Call(
            [None] * len(tasks),
            deque(payloads[start : start + size] for start in range(0, len(payloads), size)),
        )
        left = len(payloads)
        try:
            while left:
                self._assign(call.queue)
                wait(self._waitables(), timeout=self._seconds_to_next_deadline())
                for slot in range(len(self._workers)):
                    left -= self._collect(slot, call)
                left -= self._enforce_deadlines(call)
                left -= self._stop_hanging_functions(tasks, call)
        except BaseException:
            # Interrupted (Ctrl-C, a startup failure): the workers may still owe results of this call,
            # which a later call would take for its own. Only fresh workers are safe.
            self.close()
            raise
        return call.outcomes  # type: ignore[return-value]

    # ------------------------------------------------------------------ event loop steps

    def _assign(self, queue: deque[list[_Payload]]) -> None:
        for worker in self._workers:
            if not queue or not worker.ready or worker.pending:
                continue
            chunk = queue.popleft()
            try:
                worker.conn.send(chunk)
            except OSError:
                # Died while idle: nothing of the chunk ran; it goes back and _collect replaces the worker.
                queue.appendleft(chunk)
                continue
            worker.pending.extend(chunk)
            worker.deadline = time.monotonic() + self.kill_after_s

    def _waitables(self) -> list[Any]:
        return [w.conn for w in self._workers] + [w.process.sentinel for w in self._workers]

    def _seconds_to_next_deadline(self) -> float:
        deadlines = [w.deadline for w in self._workers if w.deadline is not None]
        deadlines += [w.started + self.start_timeout_s for w in self._workers if not w.ready]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else self.kill_after_s

    def _collect(self, slot: int, call: _Call) -> int:
        """Read every message worker ``slot`` has sent; replace it if it died. Returns samples finished."""
        worker = self._workers[slot]
        done = 0
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "ready":
                    worker.ready = True
                elif message[0] == "init_error":
                    raise RuntimeError(f"a reward worker could not load the reward functions: {message[1]}")
                else:
                    position, status, score, detail = message
                    expected = worker.pending.popleft()[0]
                    if position != expected:
                        raise RuntimeError(f"reward worker answered sample {position}, expected {expected}")
                    call.finish(position, ScoreOutcome(status, score, detail))
                    done += 1
                    worker.deadline = time.monotonic() + self.kill_after_s if worker.pending else None
        except (EOFError, OSError):
            pass  # the pipe closed: the process is gone, handled below
        if worker.process.is_alive():
            return done
        exitcode = worker.process.exitcode
        if not worker.ready:
            raise RuntimeError(f"a reward worker exited with code {exitcode} before it was ready")
        return done + self._replace(slot, call, "error", f"worker process died (exit code {exitcode})")

    def _enforce_deadlines(self, call: _Call) -> int:
        now = time.monotonic()
        done = 0
        for slot, worker in enumerate(self._workers):
            if not worker.ready and now - worker.started > self.start_timeout_s:
                raise RuntimeError(f"a reward worker did not start within {self.start_timeout_s} s")
            if worker.deadline is not None and now >= worker.deadline:
                detail = f"worker killed: no result within {self.kill_after_s:g} s"
                done += self._replace(slot, call, "timeout", detail)
        return done

    def _replace(self, slot: int, call: _Call, status: str, detail: str) -> int:
        """Kill worker ``slot`` and start a new one. The sample it was running gets ``status``; the rest
        of its chunk goes back to the front of the queue. Returns the number of samples finished (0 or 1)."""
        worker = self._workers[slot]
        pending = list(worker.pending)
        self._restart(slot)
        if not pending:
            return 0
        running, rest = pending[0], pending[1:]
        call.finish(running[0], ScoreOutcome(status, None, detail))
        logger.warning(
            "reward worker pid %s replaced: %s (sample %d, data_source %r)",
            worker.process.pid,
            detail,
            running[0],
            running[2],
        )
        if rest:
            call.queue.appendleft(rest)
        return 1

    def _restart(self, slot: int) -> None:
        self._workers[slot].stop(kill=True)
        self._workers[slot] = _Worker(self._ctx, self._functions, self.timeout_s)
        self.restarts += 1

    def _stop_hanging_functions(self, tasks: Sequence[ScoreTask], call: _Call) -> int:
        """Judge the results that came in since the last look; for each function whose first
        `HANG_ROWS` results of the call all timed out, report its other rows as timed out without
        running them. Returns the number of samples finished."""
        done = 0
        for position in call.take_finished():
            key = tasks[position].fn_key
            if key in call.judged:
                continue
            if call.outcomes[position].status != "timeout":  # type: ignore[union-attr]
                call.judged.add(key)
                continue
            call.leading_timeouts[key] += 1
            if call.leading_timeouts[key] >= HANG_ROWS:
                call.judged.add(key)
                done += self._drop_rows_of(key, call)
        return done

    def _drop_rows_of(self, key: str, call: _Call) -> int:
        """Report every unfinished row of function ``key`` as timed out; replace the workers holding
        any (their rows of other functions go back to the queue). Returns the rows dropped."""
        dropped: list[_Payload] = []
        for slot, worker in enumerate(self._workers):
            if any(payload[1] == key for payload in worker.pending):
                pending = list(worker.pending)
                self._restart(slot)
                dropped += [payload for payload in pending if payload[1] == key]
                others = [payload for payload in pending if payload[1] != key]
                if others:
                    call.queue.appendleft(others)
        chunks = [[payload for payload in chunk if payload[1] != key] for chunk in call.queue]
        dropped += [payload for chunk in call.queue for payload in chunk if payload[1] == key]
        call.queue.clear()
        call.queue.extend(chunk for chunk in chunks if chunk)
        detail = f"not run: the function's first {HANG_ROWS} results of this call were timeouts"
        for payload in dropped:
            call.outcomes[payload[0]] = ScoreOutcome("timeout", None, detail)
        if dropped:
            logger.warning(
                "reward function %r timed out on its first %d rows of this call; its other %d rows are "
                "reported as timed out without running",
                key,
                HANG_ROWS,
                len(dropped),
            )
        return len(dropped)


@dataclass
class _Call:
    """The state of one `ScoringPool.score` call.

    Attributes:
        outcomes: one slot per task, filled as results come in.
        queue: chunks not yet sent to a worker.
        finished: positions finished since the hang judgement last looked.
        leading_timeouts: per function key, its timeouts so far, while no other result came first.
        judged: function keys settled for this call (a result other than a timeout came first, or
            they were taken as hanging).
    """

    outcomes: list[ScoreOutcome | None]
    queue: deque[list[_Payload]]
    finished: list[int] = field(default_factory=list)
    leading_timeouts: Counter[str] = field(default_factory=Counter)
    judged: set[str] = field(default_factory=set)

    def finish(self, position: int, outcome: ScoreOutcome) -> None:
        self.outcomes[position] = outcome
        self.finished.append(position)

    def take_finished(self) -> list[int]:
        taken, self.finished = self.finished, []
        return taken
