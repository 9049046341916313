"""``calculator_arithmetic``: the recipe's environment. The model may call the calculator
(`hybridflow.tools.calculator`) by writing ``<calc>EXPRESSION</calc>``; the environment inserts
``<r>VALUE</r>`` and the model writes again. (Short tags: every character is a token of the character
model, and shorter episodes make every step cheaper.) A turn without a call is the answer: reward 1 when its text, stripped, is the row's
``ground_truth`` exactly, else 0; the episode ends.

With ``calculator=False`` (the baseline) no call is run: every first turn is the answer, so an episode
is one turn, and a turn that writes a call scores 0 like any other wrong answer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hybridflow.agents import (
    Environment,
    ModelTurn,
    Observation,
    StepResult,
    find_tool_call,
    register_environment,
)
from hybridflow.tools import make_tool

__all__ = ["CALL", "CalculatorArithmetic", "answer_reward", "wrote_call"]

CALL = re.compile(r"<calc>.*?</calc>", re.DOTALL)
"""A complete call, as the model writes it."""


def answer_reward(text: str, ground_truth: str) -> float:
    """1.0 when ``text`` stripped is ``ground_truth``, else 0.0 (no number extraction: ``"5535"`` only)."""
    return float(text.strip() == ground_truth)


def wrote_call(text: str) -> bool:
    """Whether ``text`` holds a complete calculator call (whether or not the episode could run it)."""
    return CALL.search(text) is not None


@register_environment("calculator_arithmetic")
class CalculatorArithmetic(Environment):
    """One episode of the task (module docstring).

    Args:
        calculator: whether calls are run (False: the single-turn baseline).
        tool_timeout: wall seconds one call may take.
    """

    def __init__(self, calculator: bool = True, tool_timeout: float = 5.0) -> None:
        self.tool = make_tool("calculator") if calculator else None
        self.tool_timeout = tool_timeout
        self.ground_truth = ""

    def start(self, row: Mapping[str, Any]) -> Observation:
        for key in ("prompt", "ground_truth"):
            if key not in row:
                raise KeyError(f"a calculator_arithmetic row needs {key!r}; it has {sorted(row)}")
        self.ground_truth = str(row["ground_truth"])
        return row["prompt"]

    def step(self, turn: ModelTurn) -> StepResult:
        call = None if self.tool is None else find_tool_call(turn.text, ["calc"])
        if call is None:
            return StepResult(reward=answer_reward(turn.text, self.ground_truth), done=True)
        result = self.tool.call(call[1], self.tool_timeout)
        return StepResult(observation=f"<r>{result.observation}</r>", tool_results=(result,))
