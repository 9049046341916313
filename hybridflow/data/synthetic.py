"""Synthetic tasks written as prompt datasets in the veRL row layout.

Arithmetic: problems ``A op B`` with operands of exactly ``digits`` digits (0-9 for one digit), or
from 0 to ``max_operand`` when that is given, and ``op`` among ``+ - *``. The ground truth is the
result as a decimal string (``"-12"`` for ``23-35``). Test problems are distinct; train problems
are distinct and never among the test ones, so the test split is held out. The same seed gives the
same files.

Three prompt styles:

- ``instruct``: the question plus an instruction to reason inside ``<think>...</think>`` and answer
  inside ``<answer>...</answer>``;
- ``question``: just the question, ``"What is 12 + 45?"``, for chat models that answer in free text
  (score the last number of the response);
- ``bare``: just ``"12+45="``, for tiny models with a character tokenizer.

Command line::

    python -m hybridflow.data.synthetic --task arithmetic --digits 2 --num-train 10000 \\
        --num-test 500 --out data/arith2 [--ops + - *] [--style bare] [--seed 0] [--formats parquet jsonl] \\
        [--max-operand 20]

writes ``train.parquet``, ``test.parquet``, ``train.jsonl`` and ``test.jsonl`` under ``--out``.
"""

from __future__ import annotations

import argparse
import bisect
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hybridflow.data.files import write_rows

__all__ = [
    "ARITHMETIC_DATA_SOURCE",
    "OPERATORS",
    "arithmetic_rows",
    "main",
    "solve",
    "write_splits",
]

ARITHMETIC_DATA_SOURCE = "synthetic/arithmetic"
OPERATORS = ("+", "-", "*")
STYLES = ("instruct", "question", "bare")
INSTRUCTION = (
    "Think step by step inside <think> </think>, then give the final answer as a plain number "
    "inside <answer> </answer>."
)


def solve(a: int, op: str, b: int) -> int:
    """The exact result of ``a op b``."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; expected one of {OPERATORS}")


def _operand_range(digits: int) -> tuple[int, int]:
    """(smallest operand, how many operands) for operands of exactly ``digits`` digits."""
    if digits == 1:
        return 0, 10
    return 10 ** (digits - 1), 9 * 10 ** (digits - 1)


def _complement_element(rank: int, excluded: list[int]) -> int:
    """The ``rank``-th (0-based) integer >= 0 not in the sorted list ``excluded``."""
    value = rank
    while True:
        shifted = rank + bisect.bisect_right(excluded, value)
        if shifted == value:
            return value
        value = shifted


def _prompt_text(a: int, op: str, b: int, style: str) -> str:
    if style == "bare":
        return f"{a}{op}{b}="
    if style == "question":
        return f"What is {a} {op} {b}?"
    return f"What is {a}{op}{b}? {INSTRUCTION}"


def arithmetic_rows(
    num_train: int,
    num_test: int,
    digits: int = 2,
    ops: Sequence[str] = ("+",),
    seed: int = 0,
    style: str = "instruct",
    max_operand: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Rows of the ``train`` and ``test`` splits of the arithmetic task, keyed by split name.

    Args:
        num_train, num_test: problems per split; together at most the number of distinct problems.
        digits: digits of each operand (>= 1).
        ops: operators drawn uniformly, a subset of ``+ - *``.
        seed: fixes every problem.
        style: ``"instruct"``, ``"question"`` or ``"bare"`` (see the module docstring).
        max_operand: when given, operands are 0..max_operand (inclusive) and ``digits`` is ignored.
    """
    if digits < 1:
        raise ValueError(f"digits must be >= 1, got {digits}")
    unknown = [op for op in ops if op not in OPERATORS]
    if unknown or not ops:
        raise ValueError(f"ops must be a non-empty subset of {OPERATORS}, got {list(ops)}")
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    if max_operand is not None and max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if num_train < 0 or num_test < 0:
        raise ValueError(f"split sizes must be >= 0, got num_train={num_train}, num_test={num_test}")
    ops = list(dict.fromkeys(ops))
    low, count = _operand_range(digits) if max_operand is None else (0, max_operand + 1)
    space = len(ops) * count * count
    if num_train + num_test > space:
        operands = f"{digits}-digit" if max_operand is None else f"0..{max_operand}"
        raise ValueError(
            f"{operands} problems with ops {ops} have only {space} distinct problems; "
            f"asked for num_train={num_train} + num_test={num_test}"
        )
    rng = random.Random(seed)
    test_codes = rng.sample(range(space), num_test)
    excluded = sorted(test_codes)
    train_codes = [_complement_element(r, excluded) for r in rng.sample(range(space - num_test), num_train)]

    def row(code: int, split: str, index: int) -> dict[str, Any]:
        op_index, pair = divmod(code, count * count)
        a, b = low + pair // count, low + pair % count
        op = ops[op_index]
        question = f"{a}{op}{b}"
        return {
            "data_source": ARITHMETIC_DATA_SOURCE,
            "prompt": [{"role": "user", "content": _prompt_text(a, op, b, style)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(solve(a, op, b))},
            "extra_info": {"split": split, "index": index, "a": a, "b": b, "op": op, "question": question},
        }

    return {
        "train": [row(code, "train", i) for i, code in enumerate(train_codes)],
        "test": [row(code, "test", i) for i, code in enumerate(test_codes)],
    }


def write_splits(
    splits: dict[str, list[dict[str, Any]]],
    out_dir: str | os.PathLike[str],
    formats: Sequence[str] = ("parquet", "jsonl"),
) -> list[Path]:
    """Write each split as ``{out_dir}/{split}.{format}``; returns the paths written."""
    return [
        write_rows(rows, Path(out_dir) / f"{split}.{fmt}")
        for split, rows in splits.items()
        for fmt in formats
    ]


def main(argv: Sequence[str] | None = None) -> list[Path]:
    """The command line described in the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.data.synthetic", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--task", choices=["arithmetic"], default="arithmetic")
    parser.add_argument("--digits", type=int, default=2, help="digits per operand")
    parser.add_argument("--max-operand", type=int, help="operands 0..N instead of --digits digits")
    parser.add_argument("--ops", nargs="+", default=["+"], choices=list(OPERATORS))
    parser.add_argument("--num-train", type=int, required=True)
    parser.add_argument("--num-test", type=int, required=True)
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--style", choices=list(STYLES), default="instruct")
    parser.add_argument("--formats", nargs="+", default=["parquet", "jsonl"], choices=["parquet", "jsonl"])
    args = parser.parse_args(argv)
    splits = arithmetic_rows(
        args.num_train, args.num_test, args.digits, args.ops, args.seed, args.style, args.max_operand
    )
    paths = write_splits(splits, args.out, args.formats)
    for path in paths:
        print(path)
    return paths


if __name__ == "__main__":
    main()


def ensure_arithmetic_splits(
    out_dir: str | os.PathLike[str],
    num_train: int = 7600,
    num_test: int = 500,
    digits: int = 2,
    style: str = "bare",
    seed: int = 0,
) -> Path:
    """Write the arithmetic task's ``train.parquet`` and ``test.parquet`` under ``out_dir`` unless
    they are already there; returns ``out_dir``. Recipes call this before loading their config."""
    out = Path(out_dir)
    if not (out / "train.parquet").exists() or not (out / "test.parquet").exists():
        write_splits(arithmetic_rows(num_train, num_test, digits=digits, style=style, seed=seed), out, ("parquet",))
    return out
