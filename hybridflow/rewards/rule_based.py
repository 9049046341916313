"""Rule-based reward functions: exact match, math equivalence (math-verify) and the think/answer format.

All follow the calling convention of :mod:`hybridflow.rewards.registry` and return 1.0 or 0.0.
"""

from __future__ import annotations

import re
from typing import Any

from hybridflow.rewards.extract import answers_equal, extract_answer_tag, extract_last_number
from hybridflow.rewards.registry import register_reward_function

__all__ = ["exact_match_reward", "math_verify_reward", "think_answer_format_reward"]

# No tag may appear inside another section; the answer must hold some non-space text.
_SECTION = r"(?:(?!</?think>|</?answer>).)"
_THINK_ANSWER = re.compile(
    rf"\s*<think>{_SECTION}*</think>\s*<answer>{_SECTION}*\S{_SECTION}*</answer>\s*", re.DOTALL
)


@register_reward_function("exact_match")
def exact_match_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """1.0 when the answer equals ``ground_truth``, else 0.0.

    The answer is the content of the last ``<answer>...</answer>``, or without tags the last number in
    the response. Numbers compare by value (``"042"`` equals ``"42"``), anything else as text.
    """
    answer = extract_answer_tag(solution_str)
    if answer is None:
        answer = extract_last_number(solution_str)
    return float(answer is not None and answers_equal(answer, str(ground_truth)))


@register_reward_function("math_verify")
def math_verify_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """1.0 when the response's answer is mathematically equal to ``ground_truth`` (by ``math-verify``).

    The answer is the content of the last ``<answer>...</answer>`` if there is one; otherwise
    math-verify searches the whole response: a ``\\boxed{}`` answer first (several boxes count as
    the set of their contents, so hedging scores 0), else the final expression or number.
    ``ground_truth`` is LaTeX or a plain value (``"\\frac{1}{2}"``, ``"0.5"``, ``"42"``).

    math-verify's own signal-based timeouts are switched off: they would cancel the per-sample timer
    of the :class:`~hybridflow.rewards.manager.RewardManager` worker, which bounds the time instead.
    Called outside the manager, a pathological expression is not time-limited.
    """
    # Deferred: math-verify imports sympy and its LaTeX grammar, over a second.
    from math_verify import parse, verify

    gold = parse(f"\\boxed{{{ground_truth}}}", parsing_timeout=None)
    tagged = extract_answer_tag(solution_str)
    predicted = parse(solution_str if tagged is None else f"\\boxed{{{tagged}}}", parsing_timeout=None)
    if not gold or not predicted:
        return 0.0
    return float(verify(gold, predicted, timeout_seconds=None))


def _import_math_verify() -> None:
    import math_verify  # noqa: F401


math_verify_reward.prepare = _import_math_verify  # type: ignore[attr-defined]


@register_reward_function("think_answer_format")
def think_answer_format_reward(
    data_source: str, solution_str: str, ground_truth: Any = None, extra_info: dict | None = None
) -> float:
    """1.0 when the response is exactly ``<think>...</think><answer>...</answer>``, else 0.0.

    Whitespace may surround the two sections; the answer must not be blank; neither section may contain
    another tag; nothing else may come before, between or after.
    """
    return float(_THINK_ANSWER.fullmatch(solution_str) is not None)
