"""The recipe's data: 3-digit x 2-digit products asked in chat messages that offer a calculator.

Every row's prompt is the same four messages before the question (veRL row layout: prompt messages,
``reward_model.ground_truth``):

1. a system message that describes the calculator and its call format, ``<calculator>EXPRESSION</calculator>``
   (SmolLM2's chat template ignores ``apply_chat_template(tools=...)``, so the tool can only be described
   in a message);
2. one demonstration episode on a **different operation**, a sum of two 4-digit numbers: the user asks,
   the assistant calls, a ``tool`` message holds ``<result>VALUE</result>`` (what the library's
   ``tool_calls`` environment inserts), the assistant answers;
3. the question, ``What is 123 * 45?``; the ground truth is the product, ``"5535"``.

Without the demonstration the model never wrote a call (0 of 60 greedy and sampled episodes); with it,
about half of its greedy first turns call (README.md, "Before training"). The baseline prompt
(`BASELINE_SYSTEM`, ``--no-tool`` rows) asks the same question with no tool and no demonstration.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hybridflow.data import write_rows
from recipes.tool_arithmetic import task as tool_arithmetic

__all__ = [
    "BASELINE_SYSTEM",
    "DATA_SOURCE",
    "DEMONSTRATION",
    "SYSTEM",
    "ensure_task_files",
    "multiplication_rows",
    "question",
]

DATA_SOURCE = "smollm2_tools"
SYSTEM = (
    "You are a helpful assistant with a calculator. To compute, write <calculator>EXPRESSION</calculator>, "
    "for example <calculator>12*34</calculator>. The result comes back in a tool message. Then give the "
    "final answer as a number."
)
BASELINE_SYSTEM = "You are a helpful assistant. Answer with the number."
DEMONSTRATION = (
    {"role": "user", "content": "What is 4821 + 3907?"},
    {"role": "assistant", "content": "<calculator>4821+3907</calculator>"},
    {"role": "tool", "content": "<result>8728</result>"},
    {"role": "assistant", "content": "4821 + 3907 = 8728"},
)
"""One episode on a sum, as the ``tool_calls`` environment would run it; never a product."""


def question(a: int, b: int) -> str:
    """The user's question for ``a * b``."""
    return f"What is {a} * {b}?"


def _row(a: int, b: int, split: str, index: int, tool: bool) -> dict[str, Any]:
    context = (
        [{"role": "system", "content": SYSTEM}, *DEMONSTRATION]
        if tool
        else [{"role": "system", "content": BASELINE_SYSTEM}]
    )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [*context, {"role": "user", "content": question(a, b)}],
        "reward_model": {"style": "rule", "ground_truth": str(a * b)},
        "extra_info": {"split": split, "index": index},
    }


def multiplication_rows(
    num_train: int, num_test: int, seed: int = 0, tool: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """``train`` and ``test`` rows of distinct 3-digit x 2-digit products, the same products as
    `recipes.tool_arithmetic.task.multiplication_rows` draws; ``tool``: the calculator's prompt (module
    docstring), else the baseline's."""
    products = tool_arithmetic.multiplication_rows(num_train, num_test, seed)
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, rows in products.items():
        pairs = [
            map(int, re.fullmatch(r"(\d+)\*(\d+)=", row["prompt"][0]["content"]).groups()) for row in rows
        ]
        splits[split] = [_row(a, b, split, index, tool) for index, (a, b) in enumerate(pairs)]
    return splits


def ensure_task_files(root: Path, num_train: int = 2000, num_test: int = 50) -> dict[str, Path]:
    """Write both prompt sets under ``root`` unless they are there; returns the parquet files by name:
    ``train``, ``test`` (calculator prompt) and ``baseline_train``, ``baseline_test`` (the same products,
    the baseline prompt)."""
    paths = {
        "train": root / "tool" / "train.parquet",
        "test": root / "tool" / "test.parquet",
        "baseline_train": root / "baseline" / "train.parquet",
        "baseline_test": root / "baseline" / "test.parquet",
    }
    if not all(path.exists() for path in paths.values()):
        for tool, prefix in ((True, ""), (False, "baseline_")):
            splits = multiplication_rows(num_train, num_test, tool=tool)
            for split in ("train", "test"):
                write_rows(splits[split], paths[f"{prefix}{split}"])
    return paths
