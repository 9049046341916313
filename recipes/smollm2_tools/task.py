"""The recipe's data: 3-digit x 2-digit products asked in chat messages that offer a calculator, and a
harder task, word problems whose answer takes a product and a sum or difference.

Every row's prompt is the same four messages before the question (veRL row layout: prompt messages,
``reward_model.ground_truth``):

1. a system message that describes the calculator and its call format, ``<calculator>EXPRESSION</calculator>``
   (SmolLM2's chat template ignores ``apply_chat_template(tools=...)``, so the tool can only be described
   in a message);
2. one demonstration episode on a **different operation**, a sum of two 4-digit numbers: the user asks,
   the assistant calls, a ``tool`` message holds ``<result>VALUE</result>`` (what the library's
   ``tool_calls`` environment inserts), the assistant answers;
3. the question, ``What is 123 * 45?``; the ground truth is the product, ``"5535"``. In the harder task
   (`word_problem_rows`) the question is a short story, ``A farm has 45 rows of 123 trees. 318 of the
   trees are cut down. How many trees are left?``, whose answer is ``45 * 123 - 318`` (a third of the
   stories take the product alone): the model has to write the expression itself (or make two calls),
   from words; the demonstration is a story too, whose answer is one sum (`STORY_DEMONSTRATION`).

Without the demonstration the model never wrote a call (0 of 60 greedy and sampled episodes); with it,
about half of its greedy first turns call (README.md, "Before training"). The baseline prompt
(`BASELINE_SYSTEM`, ``--no-tool`` rows) asks the same question with no tool and no demonstration.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

from hybridflow.data import write_rows
from recipes.tool_arithmetic import task as tool_arithmetic

__all__ = [
    "BASELINE_SYSTEM",
    "DATA_SOURCE",
    "DEMONSTRATION",
    "STORY_DEMONSTRATION",
    "SYSTEM",
    "TASKS",
    "WORD_PROBLEMS",
    "ensure_task_files",
    "multiplication_rows",
    "question",
    "word_problem_rows",
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
STORY_DEMONSTRATION = (
    {"role": "user", "content": "A shop has 4821 red pens and 3907 blue pens. How many pens does it have?"},
    {"role": "assistant", "content": "<calculator>4821+3907</calculator>"},
    {"role": "tool", "content": "<result>8728</result>"},
    {"role": "assistant", "content": "The shop has 8728 pens."},
)
"""The word problems' demonstration: a story whose answer is one sum. With `DEMONSTRATION` instead the model
never called on a two-step story (0 of 50 greedy and 1 of 200 sampled episodes, README.md)."""


WORD_PROBLEMS = (
    ("A shop has {a} boxes of {b} pencils. How many pencils does it have?", 0),
    ("A farm has {a} rows of {b} trees. How many trees does it have?", 0),
    ("A shop has {a} boxes of {b} pencils and {c} loose pencils. How many pencils does it have?", 1),
    ("A farm has {a} rows of {b} trees. {c} of the trees are cut down. How many trees are left?", -1),
    ("A school buys {a} packs of {b} sheets of paper and uses {c} sheets. How many sheets are left?", -1),
    ("A library has {a} shelves of {b} books and gets {c} more books. How many books does it have now?", 1),
)
"""(story, sign): ``a`` groups of ``b`` things (sign 0), and ``c`` more (sign 1) or fewer (sign -1). A third
of the stories take one product, the rest a product and a sum or difference: with only two-step stories
SmolLM2 never got one right (0 of 50 greedy, 0 of 200 sampled episodes), so GRPO would have no signal."""
TASKS = ("products", "word_problems")
"""The tasks `ensure_task_files` writes: `multiplication_rows`, `word_problem_rows`."""


def question(a: int, b: int) -> str:
    """The user's question for ``a * b``."""
    return f"What is {a} * {b}?"


def _row(
    asked: str, answer: int, split: str, index: int, tool: bool, demonstration: tuple[dict, ...] = DEMONSTRATION
) -> dict[str, Any]:
    context = (
        [{"role": "system", "content": SYSTEM}, *demonstration]
        if tool
        else [{"role": "system", "content": BASELINE_SYSTEM}]
    )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [*context, {"role": "user", "content": asked}],
        "reward_model": {"style": "rule", "ground_truth": str(answer)},
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
        splits[split] = [_row(question(a, b), a * b, split, index, tool) for index, (a, b) in enumerate(pairs)]
    return splits


def word_problem_rows(
    num_train: int, num_test: int, seed: int = 0, tool: bool = True
) -> dict[str, list[dict[str, Any]]]:
    """``train`` and ``test`` rows of distinct word problems (`WORD_PROBLEMS`): ``a`` of 2 digits, ``b``
    and ``c`` of 3 (``c`` unused by one-product stories), the answer ``a * b + sign * c`` (always
    positive); ``tool`` as in `multiplication_rows`."""
    rng = random.Random(seed)
    drawn: set[tuple[int, int, int, int]] = set()
    while len(drawn) < num_train + num_test:
        story, a, b, c = rng.randrange(len(WORD_PROBLEMS)), rng.randint(11, 99), rng.randint(100, 999), 0
        if WORD_PROBLEMS[story][1]:
            c = rng.randint(100, 999)
        drawn.add((story, a, b, c))
    problems = rng.sample(sorted(drawn), len(drawn))
    rows = []
    for index, (story, a, b, c) in enumerate(problems):
        text, sign = WORD_PROBLEMS[story]
        split, position = ("test", index) if index < num_test else ("train", index - num_test)
        asked = text.format(a=a, b=b, c=c)
        rows.append(_row(asked, a * b + sign * c, split, position, tool, STORY_DEMONSTRATION))
    return {"test": rows[:num_test], "train": rows[num_test:]}


def ensure_task_files(
    root: Path, num_train: int = 2000, num_test: int = 50, task: str = "products"
) -> dict[str, Path]:
    """Write both prompt sets of ``task`` (one of `TASKS`) under ``root`` unless they are there; returns
    the parquet files by name: ``train``, ``test`` (calculator prompt) and ``baseline_train``,
    ``baseline_test`` (the same problems, the baseline prompt). The products are written at the top of
    ``root``, the word problems under ``root / "word_problems"``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; the tasks are {', '.join(TASKS)}")
    make_rows = multiplication_rows if task == "products" else word_problem_rows
    root = root if task == "products" else root / task
    paths = {
        "train": root / "tool" / "train.parquet",
        "test": root / "tool" / "test.parquet",
        "baseline_train": root / "baseline" / "train.parquet",
        "baseline_test": root / "baseline" / "test.parquet",
    }
    if not all(path.exists() for path in paths.values()):
        for tool, prefix in ((True, ""), (False, "baseline_")):
            splits = make_rows(num_train, num_test, tool=tool)
            for split in ("train", "test"):
                write_rows(splits[split], paths[f"{prefix}{split}"])
    return paths
