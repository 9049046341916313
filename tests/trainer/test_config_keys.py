"""``data.prompt_key`` names the dataset's prompt column (it used to be validated but read by nobody)."""

from __future__ import annotations

import pytest

from hybridflow.data import PromptDataset, write_rows
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.data.schema import RowFormatError

QUESTION = [{"role": "user", "content": "2+3="}]
PROMPT = [{"role": "user", "content": "10+20="}]


@pytest.fixture
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    row = {"data_source": "toy", "prompt": PROMPT, "question": QUESTION, "reward_model": {"ground_truth": "5"}}
    write_rows([row], path)
    return path


def test_prompt_key_picks_the_prompt_column(rows_file):
    tokenizer = build_char_tokenizer()
    default = PromptDataset(rows_file, tokenizer, max_prompt_length=64)[0]
    chosen = PromptDataset(rows_file, tokenizer, max_prompt_length=64, prompt_key="question")[0]
    assert default["raw_prompt"] == PROMPT
    assert chosen["raw_prompt"] == QUESTION
    text = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert chosen["input_ids"].tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_missing_prompt_key_column_names_row_file_and_column(rows_file):
    with pytest.raises(RowFormatError, match=r"row 0 of .*rows\.jsonl: field 'query' is missing \(the data\.prompt_key"):
        PromptDataset(rows_file, build_char_tokenizer(), max_prompt_length=64, prompt_key="query")
