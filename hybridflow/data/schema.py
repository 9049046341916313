"""The row layout of prompt datasets (the columns of veRL's preprocessed datasets) and its checks.

One row is a dict with these fields:

================  ==========  =========================================================================
field             required    meaning
================  ==========  =========================================================================
``data_source``   yes         str; selects the reward function (e.g. ``"synthetic/arithmetic"``)
``prompt``        yes         non-empty list of chat messages ``{"role": str, "content": str}``, at
                              least one of them with text (not only white space)
``reward_model``  yes         dict with ``ground_truth`` and optionally ``style`` (str, ``"rule"`` or
                              ``"model"``); ``ground_truth`` is text, a number, or a list or dict of
                              them (nested, None allowed inside); bytes and other objects are refused
``ability``       no          str, a free label such as ``"math"``
``extra_info``    no          dict of anything else (``split``, ``index``, task parameters...)
================  ==========  =========================================================================
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

__all__ = ["REQUIRED_FIELDS", "RowFormatError", "validate_row"]

REQUIRED_FIELDS = ("data_source", "prompt", "reward_model")


class RowFormatError(ValueError):
    """A dataset row does not follow the layout; the message names the row and the field."""

    def __init__(self, row: int, field: str, problem: str, where: str = "") -> None:
        self.row = row
        self.field = field
        location = f" of {where}" if where else ""
        super().__init__(f"row {row}{location}: field {field!r} {problem}")


def _check_messages(messages: Any, row: int, where: str) -> None:
    if not isinstance(messages, list | tuple) or len(messages) == 0:
        raise RowFormatError(
            row, "prompt", f"must be a non-empty list of chat messages, got {type(messages).__name__}", where
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RowFormatError(row, f"prompt[{i}]", f"must be a dict, got {type(message).__name__}", where)
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "missing" if message.get(key) is None else f"a {type(message[key]).__name__}"
                raise RowFormatError(row, f"prompt[{i}].{key}", f"must be a string, got {got}", where)
    if not any(message["content"].strip() for message in messages):
        # Nothing to answer; with a template that only joins the contents it is a prompt of no tokens.
        raise RowFormatError(
            row, "prompt", "has no text: every message's content is empty or white space", where
        )


def _check_ground_truth(value: Any, field: str, row: int, where: str) -> None:
    # Reward functions compare text and numbers; anything else reaches them as its repr (bytes as
    # "b'105'") and scores a valid 0 on every row, which no counter sees.
    if value is None or isinstance(value, str | numbers.Real):
        return
    if isinstance(value, bytes | bytearray | memoryview):
        shown = bytes(value[:20])
        raise RowFormatError(
            row,
            field,
            f"is bytes ({shown!r}{'...' if len(value) > 20 else ''}), not text: a reward function would "
            "compare its repr; store it as a string (decoded) column",
            where,
        )
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_ground_truth(item, f"{field}[{i}]", row, where)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise RowFormatError(row, field, f"has a key {key!r} that is not a string", where)
            _check_ground_truth(item, f"{field}.{key}", row, where)
        return
    raise RowFormatError(
        row, field, f"must be text, a number, or a list or dict of them, got {type(value).__name__}", where
    )


def validate_row(row: Mapping[str, Any], index: int, where: str = "") -> None:
    """Raise :class:`RowFormatError` naming ``index`` and the field if ``row`` breaks the layout.

    Args:
        row: one dataset row.
        index: the row's position, reported in the error.
        where: optional file name, reported in the error.
    """
    for field in REQUIRED_FIELDS:
        if row.get(field) is None:
            raise RowFormatError(index, field, "is missing", where)
    if not isinstance(row["data_source"], str):
        raise RowFormatError(
            index, "data_source", f"must be a string, got {type(row['data_source']).__name__}", where
        )
    _check_messages(row["prompt"], index, where)
    reward_model = row["reward_model"]
    if not isinstance(reward_model, Mapping):
        raise RowFormatError(
            index, "reward_model", f"must be a dict, got {type(reward_model).__name__}", where
        )
    if reward_model.get("ground_truth") is None:
        raise RowFormatError(index, "reward_model.ground_truth", "is missing", where)
    _check_ground_truth(reward_model["ground_truth"], "reward_model.ground_truth", index, where)
    style = reward_model.get("style")
    if style is not None and not isinstance(style, str):
        raise RowFormatError(
            index, "reward_model.style", f"must be a string, got {type(style).__name__}", where
        )
    ability = row.get("ability")
    if ability is not None and not isinstance(ability, str):
        raise RowFormatError(index, "ability", f"must be a string, got {type(ability).__name__}", where)
    extra_info = row.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, Mapping):
        raise RowFormatError(index, "extra_info", f"must be a dict, got {type(extra_info).__name__}", where)
