"""The supervised data of off-policy distillation: a teacher's greedy answers to a task's prompts
(`trainer.warm_start.greedy_answers`), put in place of the rows' ground truth, so that
`trainer.warm_start.warm_start` trains a student on them."""

from __future__ import annotations

from collections.abc import Sequence


def relabelled(rows: Sequence[dict], answers: Sequence[str]) -> list[dict]:
    """Copies of ``rows`` whose ``reward_model.ground_truth`` is the matching entry of ``answers`` (the
    teacher's): the supervised targets of off-policy distillation."""
    if len(rows) != len(answers):
        raise ValueError(f"{len(rows)} rows but {len(answers)} answers")
    return [
        {**row, "reward_model": {**row["reward_model"], "ground_truth": answer}}
        for row, answer in zip(rows, answers, strict=True)
    ]
