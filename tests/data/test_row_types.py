"""Rows whose values have types a reward function cannot use, and text that is not UTF-8: refused when
the file is read, naming the file, the row and the field."""

import datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.data import (
    DataFileError,
    PromptDataset,
    RowFormatError,
    build_char_tokenizer,
    read_prompt_rows,
    read_rows,
    validate_row,
    write_rows,
)


def row(i: int, ground_truth=None) -> dict:
    return {
        "data_source": "toy",
        "prompt": [{"role": "user", "content": f"{i}+1="}],
        "reward_model": {
            "style": "rule",
            "ground_truth": str(i + 1) if ground_truth is None else ground_truth,
        },
    }


def test_a_ground_truth_column_of_bytes_is_refused_with_file_row_and_field(tmp_path):
    # A parquet binary column: `exact_match` would compare str(b'3') with the answer and score 0 on
    # every row, a valid score that no counter sees.
    rows = [row(i, str(i + 1).encode()) for i in range(3)]
    path = tmp_path / "bytes.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    assert pq.read_schema(path).field("reward_model").type.field("ground_truth").type == pa.binary()
    with pytest.raises(RowFormatError) as info:
        read_prompt_rows(path)
    assert str(info.value) == (
        f"row 0 of {path}: field 'reward_model.ground_truth' is bytes (b'1'), not text: a reward function "
        "would compare its repr; store it as a string (decoded) column"
    )
    assert (info.value.row, info.value.field) == (0, "reward_model.ground_truth")
    with pytest.raises(
        RowFormatError, match=r"row 0 of .*bytes\.parquet: field 'reward_model\.ground_truth'"
    ):
        PromptDataset(path, build_char_tokenizer(), max_prompt_length=64)


@pytest.mark.parametrize(
    ("ground_truth", "field", "problem"),
    [
        (["7", b"8"], "reward_model.ground_truth[1]", "is bytes (b'8')"),
        (
            {"target": 24, "numbers": [b"\x01" * 30]},
            "reward_model.ground_truth.numbers[0]",
            "is bytes (b'\\x01",
        ),
        (
            datetime.date(2024, 1, 1),
            "reward_model.ground_truth",
            "must be text, a number, or a list or dict of them, got date",
        ),
        (
            np.array([1, 2]),
            "reward_model.ground_truth",
            "must be text, a number, or a list or dict of them, got ndarray",
        ),
        ({1: "a"}, "reward_model.ground_truth", "has a key 1 that is not a string"),
    ],
)
def test_ground_truths_that_are_not_text_or_numbers_are_refused(ground_truth, field, problem):
    with pytest.raises(RowFormatError) as info:
        validate_row(row(5, ground_truth), 5, where="train.parquet")
    assert info.value.field == field
    assert str(info.value).startswith(f"row 5 of train.parquet: field {field!r} {problem}")


@pytest.mark.parametrize(
    "ground_truth",
    ["42", 42, 0.5, True, ["1", 2], {"target": 24, "numbers": [1, 2, 3, 4], "note": None}],
)
def test_text_numbers_and_lists_or_dicts_of_them_pass(tmp_path, ground_truth):
    validate_row(row(0, ground_truth), 0)
    validate_row(row(0, [ground_truth, np.int64(3), np.float32(0.5)]), 0)  # numpy numbers are numbers
    path = write_rows([row(0, ground_truth)], tmp_path / "ok.jsonl")
    assert read_prompt_rows(path)[0]["reward_model"]["ground_truth"] == ground_truth


def _string_array(values: list[bytes]) -> pa.Array:
    """A string array holding ``values`` as they are, valid UTF-8 or not (pyarrow checks neither here)."""
    offsets = np.cumsum([0] + [len(value) for value in values], dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), len(values), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values))]
    )


def test_invalid_utf8_in_a_parquet_text_column_names_file_row_and_field(tmp_path):
    table = pa.Table.from_pylist([row(i) for i in range(3)])
    table = table.set_column(0, "data_source", _string_array([b"toy", b"toy", b"to\xff\xfey"]))
    path = tmp_path / "latin.parquet"
    pq.write_table(table, path)
    with pytest.raises(DataFileError) as info:
        read_rows(path)
    assert str(info.value) == (
        f"file {str(path)!r} row 2 field 'data_source': not UTF-8 text (invalid start byte at byte 2)"
    )


def test_invalid_utf8_inside_a_message_names_the_message_field(tmp_path):
    contents = _string_array([b"1+1=", b"\xc3(", b"3+1="])
    messages = pa.StructArray.from_arrays([_string_array([b"user"] * 3), contents], names=["role", "content"])
    prompts = pa.ListArray.from_arrays(pa.array([0, 1, 2, 3], pa.int32()), messages)
    table = pa.Table.from_pylist([row(i) for i in range(3)])
    table = table.set_column(table.column_names.index("prompt"), "prompt", prompts)
    path = tmp_path / "nested.parquet"
    pq.write_table(table, path)
    with pytest.raises(DataFileError, match=r"row 1 field 'prompt\[0\]\.content': not UTF-8 text"):
        read_rows(path)
