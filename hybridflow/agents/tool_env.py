"""``tool_calls``: a ready environment in which the model calls registered tools by writing tags.

A turn that holds a call ``<NAME>ARGUMENT</NAME>`` (``NAME`` one of the episode's tools; the first
call of the turn counts) runs the tool and inserts ``<result>OBSERVATION</result>`` as the observation. A
turn without a call is the answer: the episode ends and a reward function (registered by name, as in
``reward.function``) scores the turn's text against the row's ``ground_truth``. Rows hold ``prompt``
(text or chat messages), ``ground_truth`` and ``data_source``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.agents.environment import (
    Environment,
    ModelTurn,
    Observation,
    StepResult,
    register_environment,
)
from hybridflow.rewards.registry import resolve_reward_function
from hybridflow.tools.base import Tool
from hybridflow.tools.registry import make_tool

__all__ = ["ToolCallEnvironment", "find_tool_call"]


def find_tool_call(text: str, names: Sequence[str]) -> tuple[str, str] | None:
    """The first ``<NAME>ARGUMENT</NAME>`` in ``text`` whose ``NAME`` is in ``names``, as (name, argument)."""
    if not names:
        return None
    alternatives = "|".join(re.escape(name) for name in names)
    match = re.search(rf"<({alternatives})>(.*?)</\1>", text, re.DOTALL)
    return (match.group(1), match.group(2)) if match else None


@register_environment("tool_calls")
class ToolCallEnvironment(Environment):
    """Tool calls by tag, reward on the answer (see the module docstring).

    Args:
        tools: tool names (each built with `hybridflow.tools.make_tool`) or built tools by name (share
            one sandboxed tool across episodes this way).
        reward: a reward function spec (`hybridflow.rewards.resolve_reward_function`).
        tool_timeout: wall seconds one call may take.
    """

    def __init__(
        self, tools: Sequence[str] | Mapping[str, Tool], reward: Any, tool_timeout: float = 10.0
    ) -> None:
        self.tools: dict[str, Tool] = (
            dict(tools) if isinstance(tools, Mapping) else {name: make_tool(name) for name in tools}
        )
        self.reward = resolve_reward_function(reward)
        self.tool_timeout = tool_timeout
        self._row: Mapping[str, Any] = {}

    def start(self, row: Mapping[str, Any]) -> Observation:
        for key in ("prompt", "ground_truth", "data_source"):
            if key not in row:
                raise KeyError(f"a tool_calls row needs {key!r}; it has {sorted(row)}")
        self._row = row
        return row["prompt"]

    def step(self, turn: ModelTurn) -> StepResult:
        call = find_tool_call(turn.text, list(self.tools))
        if call is None:
            score = self.reward(
                data_source=self._row["data_source"],
                solution_str=turn.text,
                ground_truth=self._row["ground_truth"],
                extra_info=None,
            )
            return StepResult(reward=float(score), done=True)
        name, argument = call
        result = self.tools[name].call(argument, self.tool_timeout)
        return StepResult(observation=f"<result>{result.observation}</result>", tool_results=(result,))
