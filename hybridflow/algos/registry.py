"""Name registries for the algorithm families.

A recipe picks an algorithm by name in its config (``adv_estimator: grpo``) and may add its own
without editing the library::

    from hybridflow.algos import register_advantage_estimator

    @register_advantage_estimator("my_estimator")
    def my_estimator(data, *, eps=1e-6):
        ...

The four family registries live here (rather than next to the functions) so that importing one
family never has to import another, and so a recipe can register into a family before the library
modules that fill it are imported.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATION_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "Registry",
    "UnknownNameError",
    "compares_group_samples",
    "register_advantage_estimator",
    "register_aggregation_mode",
    "register_kl_estimator",
    "register_policy_loss",
]

F = TypeVar("F", bound=Callable[..., object])


class UnknownNameError(KeyError, ValueError):
    """Raised by :meth:`Registry.get` for a name that is not registered.

    It is both a ``KeyError`` (a lookup failed) and a ``ValueError`` (a config value is wrong), so
    callers may catch whichever reads better at their site.
    """

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes; we want it readable.
        return str(self.args[0]) if self.args else ""


class Registry(Generic[F]):
    """A mapping from names to functions of one family, filled by a decorator.

    Args:
        kind: what the entries are, in words (e.g. ``"advantage estimator"``); used in messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, F] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[F], F]:
        """Decorator that registers the decorated function under ``name`` and returns it unchanged.

        Registering a taken name raises ``ValueError`` unless ``override=True``: silently replacing
        a library algorithm from a recipe is more often a typo than an intent.
        """

        def decorator(fn: F) -> F:
            self.add(name, fn, override=override)
            return fn

        return decorator

    def add(self, name: str, fn: F, *, override: bool = False) -> None:
        """Register ``fn`` under ``name`` (the non-decorator form of :meth:`register`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if not callable(fn):
            raise TypeError(f"{self.kind} {name!r} must be callable, got {type(fn).__name__}")
        if name in self._entries and not override:
            raise ValueError(
                f"{self.kind} {name!r} is already registered (to {self._entries[name].__qualname__}); "
                "pass override=True to replace it"
            )
        self._entries[name] = fn

    def unregister(self, name: str) -> F:
        """Remove ``name`` and return its function; unknown names raise :class:`UnknownNameError`."""
        fn = self.get(name)
        del self._entries[name]
        return fn

    def get(self, name: str) -> F:
        """Return the function registered under ``name``.

        Raises:
            UnknownNameError: naming ``name`` and listing every valid choice.
        """
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self._unknown_message(name)) from None

    def resolve(self, entry: str | F) -> F:
        """The function ``entry`` stands for: a name is looked up with :meth:`get`, a callable is returned
        as it is.

        Resolving a name in the process where a recipe registered it (the controller) and shipping the
        function lets worker processes, which never import the recipe, call it: the algorithm helpers
        (``aggregate_loss``, ``compute_kl``, ``compute_policy_loss``) accept either form.

        Raises:
            UnknownNameError: ``entry`` is neither callable nor a registered name.
        """
        if callable(entry):
            return entry
        return self.get(entry)

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._entries))

    def _unknown_message(self, name: object) -> str:
        message = f"unknown {self.kind} {name!r}; valid choices: {', '.join(self.names()) or '(none)'}"
        if isinstance(name, str):
            close = difflib.get_close_matches(name, self._entries, n=1)
            if close:
                message += f" (did you mean {close[0]!r}?)"
        return message

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self.names())})"


ADVANTAGE_ESTIMATORS: Registry[Callable[..., object]] = Registry("advantage estimator")
POLICY_LOSSES: Registry[Callable[..., object]] = Registry("policy loss")
KL_ESTIMATORS: Registry[Callable[..., object]] = Registry("kl estimator")
AGGREGATION_MODES: Registry[Callable[..., object]] = Registry("loss aggregation mode")


def register_advantage_estimator(
    name: str, *, override: bool = False, compares_group_samples: bool = False
) -> Callable[[F], F]:
    """Decorator registering ``fn(data, **params) -> (advantages, returns)`` as an advantage estimator.

    ``compares_group_samples`` marks an estimator whose advantage is a sample's score relative to the
    other samples of its prompt (GRPO, RLOO): config validation then requires ``rollout.n >= 2``.
    See :mod:`hybridflow.algos` for the calling convention.
    """

    def decorator(fn: F) -> F:
        fn.compares_group_samples = compares_group_samples  # type: ignore[attr-defined]
        return ADVANTAGE_ESTIMATORS.register(name, override=override)(fn)

    return decorator


def compares_group_samples(name: str) -> bool:
    """Whether the advantage estimator registered as ``name`` needs several samples per prompt."""
    return bool(getattr(ADVANTAGE_ESTIMATORS.get(name), "compares_group_samples", False))


def register_policy_loss(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering ``fn(log_prob, old_log_prob, advantages, response_mask, **kw)`` as a policy loss.

    The function returns ``(loss, metrics)``; see :mod:`hybridflow.algos.policy_losses`.
    """
    return POLICY_LOSSES.register(name, override=override)


def register_kl_estimator(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering ``fn(log_prob, ref_log_prob) -> kl [batch, response_len]`` as a KL estimator."""
    return KL_ESTIMATORS.register(name, override=override)


def register_aggregation_mode(name: str, *, override: bool = False) -> Callable[[F], F]:
    """Decorator registering a loss aggregation mode.

    The function is called as ``fn(loss_mat, mask, *, global_token_count, global_seq_count,
    norm_constant) -> scalar``; see :mod:`hybridflow.algos.aggregation`.
    """
    return AGGREGATION_MODES.register(name, override=override)
