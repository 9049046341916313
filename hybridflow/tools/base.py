"""The tool interface: a tool takes the argument text a model wrote and returns an observation text.

A tool call never raises for bad input: a refused or failing call is a :class:`ToolResult` with
outcome ``error`` (or ``timeout``) and an observation saying why, for the model to read.
"""

from __future__ import annotations

import abc
import dataclasses
import enum

__all__ = ["Tool", "ToolOutcome", "ToolResult"]


class ToolOutcome(str, enum.Enum):
    """How a tool call ended."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One call: the observation text, its outcome and its wall seconds."""

    observation: str
    outcome: ToolOutcome
    seconds: float


class Tool(abc.ABC):
    """A named tool. Subclasses set :attr:`name` and :attr:`description` and implement :meth:`call`."""

    name: str
    description: str

    @abc.abstractmethod
    def call(self, argument: str, timeout: float) -> ToolResult:
        """Run the tool on the model's ``argument`` text, within ``timeout`` wall seconds.

        Safe to call from several threads at once.
        """
