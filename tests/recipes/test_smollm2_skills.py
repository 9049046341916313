"""The smollm2 recipe's held-out skills: each skill's data asks its own operation, with answers a wrong
operator or operand range would not give, and no problem in both splits."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from recipes.smollm2.skills import MAX_TRAIN, NUM_TEST, SKILLS, skill_overrides, write_skill_data

QUESTION = re.compile(r"What is (\d+) ([-+*]) (\d+)\?")


@pytest.mark.parametrize(
    ("name", "op", "largest_operand", "train_rows"),
    [("difference", "-", 30, 31 * 31 - NUM_TEST), ("product", "*", 15, 16 * 16 - NUM_TEST), ("two_digit_sum", "+", 99, MAX_TRAIN)],
)
def test_skill_data_asks_its_operation_with_exact_answers(tmp_path, name, op, largest_operand, train_rows):
    write_skill_data(name, tmp_path)
    splits = {split: pd.read_parquet(tmp_path / f"{split}.parquet") for split in ("train", "test")}
    assert (len(splits["train"]), len(splits["test"])) == (train_rows, NUM_TEST)
    seen = {}
    for split, frame in splits.items():
        questions = set()
        for prompt, reward in zip(frame["prompt"], frame["reward_model"], strict=True):
            a, found_op, b = QUESTION.fullmatch(prompt[0]["content"]).groups()
            a, b = int(a), int(b)
            assert found_op == op and max(a, b) <= largest_operand
            assert int(reward["ground_truth"]) == {"-": a - b, "*": a * b, "+": a + b}[op]
            questions.add((a, b))
        seen[split] = questions
    assert not seen["train"] & seen["test"]
    if name == "difference":  # half the answers are negative: the rare-reward skill
        answers = [int(r["ground_truth"]) for r in splits["test"]["reward_model"]]
        assert 30 <= sum(answer < 0 for answer in answers) <= 70


def test_unknown_skill_is_named_and_overrides_point_at_the_folder(tmp_path):
    with pytest.raises(KeyError, match=r"unknown skill 'division'; known: \['difference'"):
        write_skill_data("division", tmp_path)
    assert skill_overrides(tmp_path) == [
        f"data.train_files=[{tmp_path / 'train.parquet'}]",
        f"data.val_files=[{tmp_path / 'test.parquet'}]",
    ]
    assert set(SKILLS) == {"difference", "product", "two_digit_sum"}
