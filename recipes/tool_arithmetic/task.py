"""The recipe's two data sets, in the veRL row layout (prompt messages, ``reward_model.ground_truth``).

- **The tool format** (warm start only): addition, subtraction, remainder (``%``) and powers
  (``37**3``), never multiplication. Every problem but the one-digit sums is answered through the
  calculator: the target is the whole script of the episode, ``<calc>4821+3907</calc></s><r>8728</r>8728``
  (``</s>`` is the tokenizer's end-of-sequence id, which ends the call's turn; ``<r>...</r>`` is what
  the environment inserts; the tags are short because every character is a token). Single-digit
  additions are answered directly (``7+5=`` -> ``12``), so calling is a choice the model makes from
  the prompt, not a reflex. The held-out rows of this set hold only the expected
  **first turn** (the call, or the direct answer): the warm start's held-out accuracy is the share of
  first turns written exactly.
- **The task**: 3-digit x 2-digit multiplication (``123*45=`` -> ``5535``); train and held-out problems
  are distinct.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from hybridflow.data import write_rows

__all__ = ["DATA_SOURCE", "call_script", "ensure_task_files", "format_rows", "multiplication_rows"]

DATA_SOURCE = "tool_arithmetic"
EOS = "</s>"
DIRECT_SHARE = 0.2
"""Share of the format rows answered without the tool (single-digit additions)."""
POWER_SHARE = 0.2
"""Share of the format rows that are powers (``37**3``): the only rows whose call holds a ``*``."""


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


def _operand(rng: random.Random) -> int:
    digits = rng.randint(2, 4)
    return rng.randrange(10 ** (digits - 1), 10**digits)


def _solve(a: int, op: str, b: int) -> int:
    if op == "**":
        return a**b
    if op == "%":
        return a % b
    return a + b if op == "+" else a - b


def format_rows(num_train: int, num_test: int, seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """The tool-format rows (module docstring): ``train`` rows target the whole script, ``test`` rows the
    first turn. Problems of the two splits are distinct."""
    rng = random.Random(seed)
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for split, count in (("test", num_test), ("train", num_train)):
        while len(splits[split]) < count:
            draw = rng.random()
            if draw < DIRECT_SHARE:
                a, op, b = rng.randrange(10), "+", rng.randrange(10)
            elif draw < DIRECT_SHARE + POWER_SHARE:
                a, op, b = rng.randrange(10, 100), "**", rng.randint(2, 3)
            else:
                a, op, b = _operand(rng), rng.choice("+-%"), _operand(rng)
            expression = f"{a}{op}{b}"
            value = _solve(a, op, b)
            if expression in seen and (split == "test" or op != "+" or a >= 10):
                continue  # held-out problems are never trained on (the 100 one-digit sums repeat in train)
            seen.add(expression)
            if a < 10 and b < 10:
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
