"""The recipe's two data sets, in the veRL row layout (prompt messages, ``reward_model.ground_truth``).

- **The tool format** (warm start only): a call copies the question's expression verbatim, whatever
  its operator and shape, so that the copy is generic and carries over to an operator the model has
  never called on its own. Two-operand problems with ``+ - // % **`` (operands of 1-4 digits, powers
  with a 1-3 digit base) and three-operand ones mixing ``+ - * // %`` (operands of 1-3 digits, for
  example ``27+4*318``) are answered through the calculator: the target is the whole script of the
  episode, ``<calc>4821+3907</calc></s><r>8728</r>8728`` (``</s>`` is the tokenizer's end-of-sequence
  id, which ends the call's turn; ``<r>...</r>`` is what the environment inserts; the tags are short
  because every character is a token). One-digit sums and products are answered directly
  (``7+5=`` -> ``12``, ``7*8=`` -> ``56``), so calling is a choice made from the prompt, and the only
  two-operand products the model sees are answered without the tool. A ``*`` between a 3-digit and a
  2-digit number (`TASK_SHAPE`, the task's shape) never occurs. The held-out rows of this set hold only
  the expected **first turn** (the call, or the direct answer): the warm start's held-out accuracy is
  the share of first turns written exactly.
- **The task**: 3-digit x 2-digit multiplication (``123*45=`` -> ``5535``); train and held-out problems
  are distinct.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from hybridflow.data import write_rows
from hybridflow.tools.calculator import evaluate

__all__ = [
    "DATA_SOURCE",
    "TASK_SHAPE",
    "call_script",
    "ensure_task_files",
    "format_expression",
    "format_rows",
    "multiplication_rows",
]

DATA_SOURCE = "tool_arithmetic"
EOS = "</s>"
DIRECT_SHARE = 0.2
"""Share of the format rows answered without the tool (one-digit sums and products, half each)."""
THREE_OPERAND_SHARE = 0.35
"""Share of the format rows with three operands: the only ones whose call holds a single ``*``."""
TWO_OPERAND_OPS = ("+", "-", "//", "%", "**")
THREE_OPERAND_OPS = ("+", "-", "*", "//", "%")
TASK_SHAPE = re.compile(r"(?<!\d)\d{3}\*\d{2}(?!\d)")
"""A 3-digit number times a 2-digit one: the task, which no format row contains."""


def call_script(expression: str, value: int) -> tuple[str, str]:
    """(first turn, whole script) of an episode that answers ``expression`` through the calculator."""
    call = f"<calc>{expression}</calc>"
    return call, f"{call}{EOS}<r>{value}</r>{value}"


def _row(prompt: str, target: str, split: str, index: int) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt}],
        "reward_model": {"style": "rule", "ground_truth": target},
        "extra_info": {"split": split, "index": index},
    }


def _number(rng: random.Random, low: int, high: int) -> int:
    """A number of ``low``-``high`` digits (the digit count uniform), never 0: a divisor may be any."""
    digits = rng.randint(low, high)
    return rng.randrange(max(1, 10 ** (digits - 1)), 10**digits)


def format_expression(rng: random.Random) -> tuple[str, bool]:
    """One format problem: (expression, whether it is answered directly). Shares as in the module
    docstring; an expression in `TASK_SHAPE` is drawn again."""
    while True:
        draw = rng.random()
        if draw < DIRECT_SHARE:
            return f"{rng.randrange(10)}{rng.choice('+*')}{rng.randrange(10)}", True
        if draw < DIRECT_SHARE + THREE_OPERAND_SHARE:
            a, b, c = (_number(rng, 1, 3) for _ in range(3))
            expression = f"{a}{rng.choice(THREE_OPERAND_OPS)}{b}{rng.choice(THREE_OPERAND_OPS)}{c}"
        else:
            op = rng.choice(TWO_OPERAND_OPS)
            if op == "**":
                a, b = _number(rng, 1, 3), rng.randint(2, 3)
            else:
                a, b = _number(rng, 1, 4), _number(rng, 1, 4)
                if a < 10 and b < 10:
                    continue  # one-digit pairs are the direct rows' shape
            expression = f"{a}{op}{b}"
        if not TASK_SHAPE.search(expression):
            return expression, False


def format_rows(num_train: int, num_test: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The tool-format rows (module docstring): ``train`` rows target the whole script, ``test`` rows the
    first turn. The held-out problems that use the tool are never trained on; the 200 direct ones
    repeat."""
    rng = random.Random(seed)
    held_out: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for split, count in (("test", num_test), ("train", num_train)):
        while len(splits[split]) < count:
            expression, direct = format_expression(rng)
            if not direct and expression in held_out:
                continue  # held-out problems are distinct and never trained on
            if split == "test" and not direct:
                held_out.add(expression)
            value = int(evaluate(expression))
            if direct:
                target = str(value)
            else:
                first, script = call_script(expression, value)
                target = first if split == "test" else script
            splits[split].append(_row(f"{expression}=", target, split, len(splits[split])))
    return splits


def multiplication_rows(num_train: int, num_test: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """3-digit x 2-digit products (``123*45=`` -> ``"5535"``), ``train`` and ``test`` distinct."""
    rng = random.Random(seed)
    codes = rng.sample(range(900 * 90), num_train + num_test)
    rows = []
    for index, code in enumerate(codes):
        a, b = 100 + code // 90, 10 + code % 90
        split, position = ("test", index) if index < num_test else ("train", index - num_test)
        rows.append(_row(f"{a}*{b}=", str(a * b), split, position))
    return {"test": rows[:num_test], "train": rows[num_test:]}


def ensure_task_files(root: Path, num_train: int = 5000, num_test: int = 50) -> dict[str, Path]:
    """Write the two data sets under ``root`` unless they are there; returns the four parquet files by
    name: ``format_train``, ``format_test``, ``train``, ``test`` (``num_train``/``num_test`` rows each)."""
    paths = {
        "format_train": root / "format" / "train.parquet",
        "format_test": root / "format" / "test.parquet",
        "train": root / "multiply" / "train.parquet",
        "test": root / "multiply" / "test.parquet",
    }
    if not all(path.exists() for path in paths.values()):
        formats, products = format_rows(num_train, num_test), multiplication_rows(num_train, num_test)
        for split in ("train", "test"):
            write_rows(formats[split], paths[f"format_{split}"])
            write_rows(products[split], paths[split])
    return paths
