"""PromptDataset and PromptCollator on real parquet / jsonl files and the character tokenizer."""

import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hybridflow.data import (
    PromptCollator,
    PromptDataset,
    RowFormatError,
    build_char_tokenizer,
    read_rows,
    render_plain,
    write_rows,
)


def verl_row(i: int, content: str) -> dict:
    return {
        "data_source": "openai/gsm8k" if i % 2 else "synthetic/arithmetic",
        "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"ground_truth": str(i * 7), "style": "rule"},
        "extra_info": {"split": "train", "index": i},
    }


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture
def hf_cache(tmp_path):
    return str(tmp_path / "hf-cache")


@pytest.mark.parametrize("suffix", ["parquet", "jsonl"])
def test_verl_file_round_trip_keeps_every_row(tmp_path, hf_cache, suffix):
    rows = [verl_row(i, f"{i}+{i}=") for i in range(6)]
    path = write_rows(rows, tmp_path / f"train.{suffix}")
    assert read_rows(path, cache_dir=hf_cache) == rows


def test_parquet_written_by_pyarrow_reads_as_prompts(tmp_path, hf_cache, tokenizer):
    rows = [verl_row(i, f"{i}*3=") for i in range(4)]
    path = tmp_path / "pa.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    dataset = PromptDataset(path, tokenizer, max_prompt_length=64, cache_dir=hf_cache)
    assert len(dataset) == 4
    item = dataset[3]
    # The character template concatenates the contents: one token per character.
    assert tokenizer.decode(item["input_ids"]) == "Be brief.3*3="
    assert item["ground_truth"] == "21"
    assert item["data_source"] == "openai/gsm8k"
    assert item["raw_prompt"] == rows[3]["prompt"]
    assert item["extra_info"] == {"split": "train", "index": 3}


def test_long_prompts_are_filtered_counted_and_logged(tmp_path, hf_cache, tokenizer, caplog):
    contents = ["1+1=", "x" * 40, "22+22=", "y" * 31, "z" * 21]  # 9 + len tokens each with the system text
    path = write_rows([verl_row(i, c) for i, c in enumerate(contents)], tmp_path / "mixed.jsonl")
    with caplog.at_level(logging.WARNING, logger="hybridflow.data.dataset"):
        dataset = PromptDataset([path], tokenizer, max_prompt_length=30, cache_dir=hf_cache)
    assert dataset.num_loaded == 5
    assert dataset.num_filtered == 2
    assert dataset.filtered_indices == (1, 3)
    assert [dataset[i]["index"] for i in range(len(dataset))] == [0, 2, 4]
    assert all(len(dataset[i]["input_ids"]) <= 30 for i in range(len(dataset)))
    assert (
        f"filtered 2 of 5 prompts longer than max_prompt_length=30 tokens (longest 49): {path} row 1, {path} row 3"
        in caplog.text
    )


def test_all_prompts_too_long_is_an_error(tmp_path, hf_cache, tokenizer):
    path = write_rows([verl_row(0, "w" * 50)], tmp_path / "long.parquet")
    with pytest.raises(ValueError, match="no prompts left"):
        PromptDataset(path, tokenizer, max_prompt_length=10, cache_dir=hf_cache)


@pytest.mark.parametrize(
    ("breakage", "field"),
    [
        (lambda row: row.pop("reward_model"), "'reward_model' is missing"),
        (lambda row: row["reward_model"].pop("ground_truth"), "'reward_model.ground_truth' is missing"),
        (lambda row: row["prompt"][1].update(content=None), "'prompt[1].content' must be a string"),
        (lambda row: row.update(prompt=[]), "'prompt' must be a non-empty list"),
        (lambda row: row.update(data_source=None), "'data_source' is missing"),
    ],
)
def test_malformed_row_error_names_row_and_field(tmp_path, hf_cache, tokenizer, breakage, field):
    rows = [verl_row(i, "1+2=") for i in range(4)]
    breakage(rows[2])
    path = tmp_path / "bad.jsonl"
    write_rows(rows, path)
    with pytest.raises(RowFormatError, match=r"row 2 of .*bad\.jsonl") as info:
        PromptDataset(path, tokenizer, max_prompt_length=64, cache_dir=hf_cache)
    assert field in str(info.value)
    assert info.value.row == 2


def test_tokenizer_without_template_gets_plain_template(tmp_path, hf_cache):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = None
    messages = [{"role": "user", "content": "7+8="}]
    assert render_plain(messages) == "user: 7+8=\nassistant: "
    path = write_rows([{**verl_row(0, ""), "prompt": messages}], tmp_path / "one.parquet")
    dataset = PromptDataset(path, tokenizer, max_prompt_length=64, cache_dir=hf_cache)
    assert tokenizer.decode(dataset[0]["input_ids"]) == "user: 7+8=\nassistant: "


def test_collator_left_pads_with_positions_and_keeps_columns():
    items = [
        {
            "input_ids": [5, 6, 7],
            "raw_prompt": "a",
            "ground_truth": "1",
            "data_source": "s",
            "extra_info": {},
            "index": 4,
        },
        {
            "input_ids": [8],
            "raw_prompt": "b",
            "ground_truth": "2",
            "data_source": "t",
            "extra_info": {"k": 1},
            "index": 9,
        },
    ]
    batch = PromptCollator(pad_token_id=0)(items)
    assert torch.equal(batch["input_ids"], torch.tensor([[5, 6, 7], [0, 0, 8]]))
    assert torch.equal(batch["attention_mask"], torch.tensor([[1, 1, 1], [0, 0, 1]]))
    assert torch.equal(batch["position_ids"], torch.tensor([[0, 1, 2], [0, 0, 0]]))
    assert list(batch["uid"]) == ["4", "9"]
    assert list(batch["ground_truth"]) == ["1", "2"]
    assert list(batch["data_source"]) == ["s", "t"]
    assert batch["extra_info"][1] == {"k": 1}

    fixed = PromptCollator(pad_token_id=3, pad_to=5)(items)
    assert torch.equal(fixed["input_ids"][1], torch.tensor([3, 3, 3, 3, 8]))
    assert torch.equal(fixed["position_ids"][0], torch.tensor([0, 0, 0, 1, 2]))
    with pytest.raises(ValueError, match=r"index \[4\]"):
        PromptCollator(pad_token_id=0, pad_to=2)(items)
