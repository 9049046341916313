"""Pulling the final answer out of a model's response text."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["answers_equal", "extract_answer_tag", "extract_last_number"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Thousands separators first so "1,234" is one number, not "234".
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def extract_answer_tag(text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` in ``text``, or None if there is none."""
    matches = _ANSWER_TAG.findall(text)
    return matches[-1].strip() if matches else None


def extract_last_number(text: str) -> str | None:
    """The last number written in ``text`` (``"-12"``, ``"3.5"``, ``"1,234"``), or None."""
    matches = _NUMBER.findall(text)
    return matches[-1] if matches else None


def _as_decimal(text: str) -> Decimal | None:
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def answers_equal(answer: str, ground_truth: str) -> bool:
    """Whether two answers are the same: equal as numbers when both are numbers, else equal as text.

    Surrounding whitespace and one trailing period are ignored (``"42."`` equals ``"42"``).
    """
    answer, ground_truth = (s.strip().removesuffix(".").strip() for s in (answer, ground_truth))
    a, b = _as_decimal(answer), _as_decimal(ground_truth)
    if a is not None and b is not None:
        return a == b
    return answer == ground_truth
