"""Environments the agent tests share: they record what they saw, so a test can rebuild the ledger."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from hybridflow.agents import Environment, ModelTurn, Observation, StepResult, register_environment
from hybridflow.tools import Tool, ToolOutcome, ToolResult


@register_environment("test_counting")
class CountingEnvironment(Environment):
    """Observation ``"=<turn>("`` after every turn; turn ``t`` earns ``t + 1``; done after ``turns`` turns.

    Records every turn it was given (``self.turns``) and every observation text it returned.
    """

    def __init__(self, turns: int = 3) -> None:
        self.episode_turns = turns
        self.turns: list[ModelTurn] = []
        self.observations: list[str] = []
        self.prompt = ""

    def start(self, row: Mapping[str, Any]) -> Observation:
        self.prompt = row["prompt"]
        return self.prompt

    def step(self, turn: ModelTurn) -> StepResult:
        self.turns.append(turn)
        done = turn.turn + 1 >= self.episode_turns
        observation = None if done else f"={turn.turn}("
        if observation is not None:
            self.observations.append(observation)
        return StepResult(observation=observation, reward=float(turn.turn + 1), done=done)


class SleepTool(Tool):
    """Sleeps ``seconds`` and records the call's (start, end) monotonic times in a shared list."""

    name = "sleep"
    description = "sleeps"

    def __init__(self, seconds: float, calls: list[tuple[int, float, float]], episode: int) -> None:
        self.seconds, self.calls, self.episode = seconds, calls, episode
        self._lock = threading.Lock()

    def call(self, argument: str, timeout: float) -> ToolResult:
        start = time.monotonic()
        time.sleep(self.seconds)
        end = time.monotonic()
        with self._lock:
            self.calls.append((self.episode, start, end))
        return ToolResult("slept", ToolOutcome.OK, end - start)


class SleepingEnvironment(Environment):
    """Calls a `SleepTool` on every turn; ends after ``turns`` turns."""

    def __init__(self, tool: SleepTool, turns: int) -> None:
        self.tool, self.episode_turns = tool, turns

    def start(self, row: Mapping[str, Any]) -> Observation:
        return row["prompt"]

    def step(self, turn: ModelTurn) -> StepResult:
        result = self.tool.call(turn.text, timeout=5.0)
        done = turn.turn + 1 >= self.episode_turns
        return StepResult(observation="=(", done=done, tool_results=(result,))
