"""``@register``: declare how a worker method's data moves between the controller and the ranks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
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
        reads: columns the method needs in its Batch argument; checked on the controller before the call.
        writes: columns the returned Batch always holds; checked when a blocking call returns.
        prepare: ``prepare(args, kwargs) -> (args, kwargs)``, run on the controller before dispatch: e.g.
            to resolve registered names to functions, so that a recipe's registrations reach workers.
    """

    dispatch: DispatchMode
    execute: Literal["all", "rank_zero"]
    blocking: bool
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    prepare: Callable[[tuple, dict], tuple[tuple, dict]] | None = None


def register(
    dispatch: str | DispatchMode = "one_to_all",
    execute: Literal["all", "rank_zero"] = "all",
    blocking: bool = True,
    reads: Iterable[str] = (),
    writes: Iterable[str] = (),
    prepare: Callable[[tuple, dict], tuple[tuple, dict]] | None = None,
) -> Callable[[F], F]:
    """Mark a `Worker` method as callable through a worker group.

    ``reads`` and ``writes`` declare the method's Batch contract (`RegisteredMethod`); a call whose Batch
    lacks a column it reads fails on the controller with a `MissingColumnError` naming both.

    Example::

        class Actor(Worker):
            @register(dispatch=DataParallel(mesh="infer"), blocking=False, reads=("input_ids",))
            def generate_sequences(self, prompts: Batch) -> Batch: ...
    """
    if execute not in ("all", "rank_zero"):
        raise ValueError(f"execute must be 'all' or 'rank_zero', got {execute!r}")
    spec = RegisteredMethod(get_dispatch_mode(dispatch), execute, blocking, tuple(reads), tuple(writes), prepare)

    def mark(method: F) -> F:
        setattr(method, _ATTRIBUTE, spec)
        return method

    return mark


def registered_methods(cls: type) -> dict[str, RegisteredMethod]:
    """Every registered method of ``cls`` (inherited ones included), by name.

    A subclass that overrides a registered method without decorating it again keeps the registration
    of the method it overrides (the nearest one up the MRO), so a recipe's worker class can wrap
    ``update_actor`` with a plain ``def`` and ``super()`` call.
    """
    found = {}
    for name in dir(cls):
        for owner in cls.__mro__:
            spec = getattr(owner.__dict__.get(name), _ATTRIBUTE, None)
            if isinstance(spec, RegisteredMethod):
                found[name] = spec
                break
    return found
