"""The Batch contract: which columns a step reads and writes, checked where the data moves.

Worker methods declare theirs in ``@register(reads=..., writes=...)`` and the worker group checks them on
the controller, before anything is sent and after the results come back. Controller steps declare theirs
with `step_columns`. Either way a missing column is a `MissingColumnError` that names the step and the
column, instead of a ``KeyError`` deep inside a worker.

Rollouts can stay on the workers that generated them (`workers.rollout_store`): a batch then carries
``rollout_ids`` in place of the columns the workers hold, and a method declares those with ``held``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from hybridflow.protocol import Batch

__all__ = ["ROLLOUT_IDS", "MissingColumnError", "first_batch", "require_columns", "step_columns"]

F = TypeVar("F", bound=Callable[..., Any])

ROLLOUT_IDS = "rollout_ids"
"""``rollout_ids [rows]`` int64: the ids under which the workers hold a step's rollout rows."""


class MissingColumnError(KeyError, ValueError):
    """A step was given a Batch without a column it reads, or returned one without a column it writes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def require_columns(
    batch: Batch, columns: Iterable[str], step: str, *, produced: bool = False, held: Iterable[str] = ()
) -> None:
    """Raise `MissingColumnError` naming ``step`` and every column of ``columns`` that ``batch`` lacks.

    ``produced`` words the message for a step's output rather than its input. ``held`` are columns the
    workers keep from generation: a batch with ``rollout_ids`` need not carry them.
    """
    held = tuple(held)
    skipped = held if ROLLOUT_IDS in batch else ()
    missing = [column for column in columns if column not in batch and column not in skipped]
    if not missing:
        return
    what = "returned no column" if produced else "needs column"
    plural = "s" if len(missing) > 1 else ""
    instead = f" (or {ROLLOUT_IDS!r} of rollouts the workers hold)" if set(missing) & set(held) else ""
    raise MissingColumnError(
        f"{step} {what}{plural} {', '.join(repr(c) for c in missing)}{instead}; "
        f"the batch has: {', '.join(sorted(batch.keys())) or '(no columns)'}"
    )


def first_batch(args: tuple, kwargs: dict) -> Batch | None:
    """The first `Batch` among a call's positional, then keyword, arguments (``None`` if there is none)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Batch):
            return value
    return None


def step_columns(*, reads: Iterable[str] = (), writes: Iterable[str] = ()) -> Callable[[F], F]:
    """Declare the columns a controller step reads from its first Batch argument and writes to the Batch
    it returns (or to the first element of a returned tuple).

    The declaration is checked on every call and kept on the function as ``reads`` and ``writes``::

        @step_columns(reads=("scores", "group_ids"), writes=("advantages",))
        def group_advantages(rollouts: Batch) -> Batch: ...
    """
    reads, writes = tuple(reads), tuple(writes)

    def decorate(fn: F) -> F:
        name = fn.__name__

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            batch = first_batch(args, kwargs)
            if batch is not None:
                require_columns(batch, reads, name)
            result = fn(*args, **kwargs)
            output = result[0] if isinstance(result, tuple) else result
            if isinstance(output, Batch):
                require_columns(output, writes, name, produced=True)
            return result

        checked.reads, checked.writes = reads, writes  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return decorate
