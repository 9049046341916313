"""A calculator tool: arithmetic on numbers, parsed with :mod:`ast` and evaluated node by node (no ``eval``).

Accepted: integer and decimal literals, ``+ - * / // % **``, unary ``+ -`` and parentheses. Anything
else (names, calls, attributes, strings, comparisons) is refused. Bounds keep every call small:
at most :data:`MAX_CHARS` characters of input, a power's exponent at most :data:`MAX_EXPONENT` in
size, and integers at most :data:`MAX_BITS` bits. Integer arithmetic is exact; ``/`` gives a float.
A float result that is a whole number below 2**53 prints as an integer (``6/3`` -> ``2``).
"""

from __future__ import annotations

import ast
import math
import operator
import time
from collections.abc import Callable

from hybridflow.tools.base import Tool, ToolOutcome, ToolResult
from hybridflow.tools.registry import register_tool

__all__ = ["MAX_BITS", "MAX_CHARS", "MAX_EXPONENT", "Calculator", "CalculatorError", "evaluate"]

MAX_CHARS = 200
MAX_EXPONENT = 4096
MAX_BITS = 4096

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalculatorError(ValueError):
    """An expression the calculator refuses or cannot evaluate; the message says why."""


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    # Refused before computing: the result's size in bits is exponent * log2|base| (checked exactly after).
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and exponent * math.log2(abs(base)) > MAX_BITS + 1
    ):
        raise CalculatorError(f"result would exceed {MAX_BITS} bits")
    return base**exponent


def _check(value: Number) -> Number:
    if isinstance(value, complex):
        raise CalculatorError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalculatorError(f"result exceeds {MAX_BITS} bits")
    return value


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check(_power(left, right))
        return _check(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise CalculatorError(f"not allowed in an expression: {ast.unparse(node)!r}")


def evaluate(expression: str) -> Number:
    """The value of the arithmetic ``expression``.

    Raises:
        CalculatorError: the expression is too long, does not parse, uses anything but numbers and the
            seven operators, breaks a bound, divides by zero or overflows a float.
    """
    if len(expression) > MAX_CHARS:
        raise CalculatorError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as error:
        raise CalculatorError(
            f"not an expression: {error.msg if isinstance(error, SyntaxError) else error}"
        ) from None
    try:
        return _evaluate(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except OverflowError:
        raise CalculatorError("float overflow") from None


def format_number(value: Number) -> str:
    """``value`` as the calculator prints it (whole floats below 2**53 as integers)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


@register_tool("calculator")
class Calculator(Tool):
    """Evaluates one arithmetic expression (see the module docstring); bounded, so it ends far inside any timeout."""

    description = "Evaluate an arithmetic expression with + - * / // % ** and parentheses, e.g. 123*45."

    def call(self, argument: str, timeout: float) -> ToolResult:
        """The expression's value as text, or ``error: <why>``."""
        start = time.monotonic()
        try:
            observation, outcome = format_number(evaluate(argument)), ToolOutcome.OK
        except CalculatorError as error:
            observation, outcome = f"error: {error}", ToolOutcome.ERROR
        return ToolResult(observation, outcome, time.monotonic() - start)
