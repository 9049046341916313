"""The episode interface: an environment a recipe writes and registers by name, like a reward function.

An environment object lives for one episode. The rollout loop calls `Environment.start` once with the
episode's data row, then, after each turn the policy samples, `Environment.step` with that turn; the step
answers with an observation to insert, an optional reward for the turn, and whether the episode is done.
Steps run on a thread pool, so a step may block (on a tool, a sandbox, a remote service) while other
episodes generate; one environment object only ever sees its own episode's calls, one at a time.

What an environment returns is text or messages, turned into ids by the loop's codec
(`hybridflow.agents.codec`), or `TokenIds` inserted as they are.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridflow.tools.base import ToolResult

__all__ = [
    "ENVIRONMENTS",
    "Environment",
    "ModelTurn",
    "Observation",
    "StepResult",
    "TokenIds",
    "get_environment",
    "make_environment",
    "register_environment",
]


@dataclass(frozen=True)
class TokenIds:
    """Ids an environment inserts as they are (no codec involved)."""

    ids: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))


Observation = str | Mapping[str, Any] | Sequence[Mapping[str, Any]] | TokenIds
"""What a start or a step hands the codec: text, one chat message, a list of chat messages, or ids."""


@dataclass(frozen=True)
class ModelTurn:
    """One turn the policy sampled.

    Attributes:
        token_ids: the exact ids the engine sampled (the stop token included when it stopped).
        text: those ids decoded without special tokens, for the environment to read; never tokenised
            again.
        finish_reason: ``"stop"`` (a stop token ended the turn) or ``"length"`` (the turn's token
            budget did).
        turn: 0-based index of the turn in its episode.
    """

    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    turn: int


@dataclass(frozen=True)
class StepResult:
    """The environment's answer to one turn.

    Attributes:
        observation: what to insert before the policy's next turn; ignored when ``done``.
        reward: the turn's reward, or None for none (0 in the episode's sum).
        done: whether the episode ends after this turn.
        tool_results: the tool calls the step made, for the rollout's metrics.
    """

    observation: Observation | None = None
    reward: float | None = None
    done: bool = False
    tool_results: tuple[ToolResult, ...] = field(default_factory=tuple)


class Environment(abc.ABC):
    """One episode's environment. Subclasses implement `start` and `step`."""

    @abc.abstractmethod
    def start(self, row: Mapping[str, Any]) -> Observation:
        """The episode's first input (usually chat messages) from its data row."""

    @abc.abstractmethod
    def step(self, turn: ModelTurn) -> StepResult:
        """React to the policy's turn. Runs on a worker thread; may block."""


ENVIRONMENTS: dict[str, Callable[..., Environment]] = {}


def register_environment(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Decorator registering an environment class (or factory) under ``name``; a second one under the
    same name is an error."""

    def decorate(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        if name in ENVIRONMENTS and ENVIRONMENTS[name] is not factory:
            raise ValueError(f"an environment is already registered as {name!r}: {ENVIRONMENTS[name]}")
        ENVIRONMENTS[name] = factory
        return factory

    return decorate


def get_environment(name: str) -> Callable[..., Environment]:
    """The environment factory registered as ``name``; a KeyError lists the registered names otherwise."""
    if name not in ENVIRONMENTS:
        raise KeyError(f"no environment registered as {name!r}; registered: {sorted(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]


def make_environment(name: str, **kwargs: Any) -> Environment:
    """A new environment (one episode's) of the kind registered as ``name``, built with ``kwargs``."""
    return get_environment(name)(**kwargs)
