"""``@register``: declare how a worker method's data moves between the controller and the ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from hybridflow.controller.dispatch import DispatchMode, get_dispatch_mode

__all__ = ["RegisteredMethod", "register", "registered_methods"]

F = TypeVar("F", bound=Callable[..., Any])
_ATTRIBUTE = "__hybridflow_register__"


@dataclass(frozen=True)
class RegisteredMethod:
    """How a registered method is called through a worker group.

    Attributes:
        dispatch: how arguments are sent and outputs collected.
        execute: ``"all"`` runs the method on the ranks the dispatch mode names; ``"rank_zero"``
            runs it on rank 0 only, whatever the mode.
        blocking: ``True`` returns the collected result; ``False`` returns a `GroupFuture` that can
            be passed to the next call without the data coming back to the controller.
    """

    dispatch: DispatchMode
    execute: Literal["all", "rank_zero"]
    blocking: bool


def register(
    dispatch: str | DispatchMode = "one_to_all",
    execute: Literal["all", "rank_zero"] = "all",
    blocking: bool = True,
) -> Callable[[F], F]:
    """Mark a `Worker` method as callable through a worker group.

    Example::

        class Actor(Worker):
            @register(dispatch=DataParallel(mesh="infer"), blocking=False)
            def generate_sequences(self, prompts: Batch) -> Batch: ...
    """
    if execute not in ("all", "rank_zero"):
        raise ValueError(f"execute must be 'all' or 'rank_zero', got {execute!r}")
    spec = RegisteredMethod(get_dispatch_mode(dispatch), execute, blocking)

    def mark(method: F) -> F:
        setattr(method, _ATTRIBUTE, spec)
        return method

    return mark


def registered_methods(cls: type) -> dict[str, RegisteredMethod]:
    """Every registered method of ``cls`` (inherited ones included), by name."""
    found = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), _ATTRIBUTE, None)
        if isinstance(spec, RegisteredMethod):
            found[name] = spec
    return found
