"""The calculator tool: known answers, and inputs it refuses with an error observation."""

from __future__ import annotations

import pytest

from hybridflow.tools import Calculator, CalculatorError, ToolOutcome, evaluate, get_tool, make_tool
from hybridflow.tools.calculator import MAX_BITS


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("123*45", "5535"),
        ("987 * 65", "64155"),
        ("2 + 3 * 4", "14"),
        ("(2 + 3) * 4", "20"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("6 / 3", "2"),
        ("1 / 4", "0.25"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("-(3 - 5)", "2"),
        ("1.5 * 4", "6"),
        ("99999999999999999999 + 1", "100000000000000000000"),
    ],
)
def test_known_answers(expression, expected):
    result = Calculator().call(expression, timeout=1.0)
    assert (result.observation, result.outcome) == (expected, ToolOutcome.OK)


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("__import__('os').system('true')", "not allowed"),
        ("x + 1", "not allowed"),
        ("abs(-1)", "not allowed"),
        ("'a' * 3", "not allowed"),
        ("1 < 2", "not allowed"),
        ("True + 1", "not allowed"),
        ("1j * 2", "not allowed"),
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("9 ** 9999", "exponent"),
        ("9 ** 9 ** 9", "exponent"),
        ("255 ** 999", "bits"),
        ("10.0 ** 400", "float overflow"),
        ("1 +", "not an expression"),
        ("1" * 300, "longer than"),
    ],
)
def test_refused_inputs(expression, reason):
    with pytest.raises(CalculatorError, match=reason):
        evaluate(expression)
    result = Calculator().call(expression, timeout=1.0)
    assert result.outcome is ToolOutcome.ERROR
    assert result.observation.startswith("error: ") and reason in result.observation


def test_integers_stay_within_the_bit_bound():
    assert evaluate("2 ** 4095") == 2 ** (MAX_BITS - 1)
    assert evaluate("2 ** 4000 * 2 ** 95") == 2 ** (MAX_BITS - 1)
    with pytest.raises(CalculatorError, match="bits"):
        evaluate("2 ** 4000 * 2 ** 96")
    with pytest.raises(CalculatorError, match="bits"):
        evaluate("2 ** 4096")


def test_registered_by_name():
    assert get_tool("calculator") is Calculator
    assert make_tool("calculator").call("12*12", timeout=1.0).observation == "144"
    with pytest.raises(KeyError, match="registered"):
        get_tool("abacus")
