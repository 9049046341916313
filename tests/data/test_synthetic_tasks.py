"""The arithmetic generator: deterministic, correct answers, held-out test split, veRL files."""

import pytest

from hybridflow.data import PromptDataset, build_char_tokenizer, read_rows
from hybridflow.data.synthetic import arithmetic_rows, main


def test_same_seed_same_rows_other_seed_other_rows():
    assert arithmetic_rows(50, 10, digits=3, seed=5) == arithmetic_rows(50, 10, digits=3, seed=5)
    assert arithmetic_rows(50, 10, digits=3, seed=5) != arithmetic_rows(50, 10, digits=3, seed=6)


def test_answers_are_right_and_operands_have_the_digits():
    splits = arithmetic_rows(200, 50, digits=2, ops=["+", "-", "*"], seed=0, style="bare")
    seen_ops = set()
    for row in splits["train"] + splits["test"]:
        info = row["extra_info"]
        a, b, op = info["a"], info["b"], info["op"]
        seen_ops.add(op)
        assert 10 <= a <= 99 and 10 <= b <= 99
        assert row["prompt"] == [{"role": "user", "content": f"{a}{op}{b}="}]
        expected = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert row["reward_model"] == {"style": "rule", "ground_truth": str(expected)}
        assert row["data_source"] == "synthetic/arithmetic"
    assert seen_ops == {"+", "-", "*"}


def test_splits_are_distinct_and_disjoint_even_when_nearly_exhausted():
    # One-digit addition has exactly 100 problems: all of them, split 70 / 30.
    splits = arithmetic_rows(70, 30, digits=1, seed=2)
    train = {r["extra_info"]["question"] for r in splits["train"]}
    test = {r["extra_info"]["question"] for r in splits["test"]}
    assert len(train) == 70 and len(test) == 30
    assert not train & test
    with pytest.raises(ValueError, match="only 100 distinct problems"):
        arithmetic_rows(71, 30, digits=1)


def test_instruct_prompt_asks_for_think_and_answer_tags():
    content = arithmetic_rows(1, 0, digits=4, seed=1)["train"][0]["prompt"][0]["content"]
    assert content.startswith("What is ")
    assert "<think>" in content and "<answer>" in content


def test_max_operand_bounds_operands_and_question_style_asks_in_words():
    # Operands 0..20: 21 * 21 = 441 sums, all of them split 341 / 100.
    splits = arithmetic_rows(341, 100, max_operand=20, style="question", seed=0)
    rows = splits["train"] + splits["test"]
    pairs = {(r["extra_info"]["a"], r["extra_info"]["b"]) for r in rows}
    assert pairs == {(a, b) for a in range(21) for b in range(21)}
    for row in rows:
        a, b = row["extra_info"]["a"], row["extra_info"]["b"]
        assert row["prompt"] == [{"role": "user", "content": f"What is {a} + {b}?"}]
        assert row["reward_model"]["ground_truth"] == str(a + b)
    with pytest.raises(ValueError, match=r"0\.\.20 problems with ops \['\+'\] have only 441"):
        arithmetic_rows(342, 100, max_operand=20)
    with pytest.raises(ValueError, match="max_operand must be >= 0"):
        arithmetic_rows(1, 0, max_operand=-1)


def test_command_line_writes_parquet_and_jsonl_that_load(tmp_path):
    out = tmp_path / "arith"
    main(["--task", "arithmetic", "--digits", "2", "--num-train", "12", "--num-test", "4", "--out", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [
        "test.jsonl",
        "test.parquet",
        "train.jsonl",
        "train.parquet",
    ]
    cache = str(tmp_path / "hf-cache")
    assert read_rows(out / "train.parquet", cache) == read_rows(out / "train.jsonl", cache)
    assert read_rows(out / "test.jsonl", cache) == arithmetic_rows(12, 4, digits=2, seed=0)["test"]
    dataset = PromptDataset(
        out / "train.parquet", build_char_tokenizer(), max_prompt_length=200, cache_dir=cache
    )
    assert len(dataset) == 12
