"""``tool_calls``: a tagged call runs the registered tool and inserts its result; an answer is scored by
the named reward function."""

from __future__ import annotations

import pytest

from hybridflow.agents import ModelTurn, find_tool_call, make_environment
from hybridflow.tools import ToolOutcome


def _turn(text: str, turn: int = 0) -> ModelTurn:
    return ModelTurn(token_ids=(), text=text, finish_reason="stop", turn=turn)


def test_a_calculator_call_then_the_answer():
    environment = make_environment("tool_calls", tools=["calculator"], reward="exact_match")
    row = {"prompt": "What is 12*34?", "ground_truth": "408", "data_source": "arith"}
    assert environment.start(row) == "What is 12*34?"
    called = environment.step(_turn("let me see <calculator>12*34</calculator>"))
    assert called.observation == "<result>408</result>" and not called.done and called.reward is None
    assert [r.outcome for r in called.tool_results] == [ToolOutcome.OK]
    refused = environment.step(_turn("<calculator>open('x')</calculator>", 1))
    assert (
        refused.observation.startswith("<result>error:")
        and refused.tool_results[0].outcome == ToolOutcome.ERROR
    )
    assert environment.step(_turn("The answer is 408", 2)).reward == 1.0
    assert environment.step(_turn("The answer is 407", 2)).done


def test_only_the_episode_tools_are_calls_and_rows_are_checked():
    assert find_tool_call("<python>1</python> <calculator>2+2</calculator>", ["calculator"]) == (
        "calculator",
        "2+2",
    )
    assert find_tool_call("<calculator>2+2</python>", ["calculator"]) is None
    environment = make_environment("tool_calls", tools=["calculator"], reward="exact_match")
    with pytest.raises(KeyError, match="'ground_truth'"):
        environment.start({"prompt": "x", "data_source": "arith"})
