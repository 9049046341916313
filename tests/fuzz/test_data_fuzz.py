"""Malformed dataset rows, generated: fields missing, added, of the wrong type or empty, and chat
messages that are not messages, in jsonl and parquet files among valid rows.

The invariant, for the library and for the trainer's up-front checks alike: a bad row is reported by
file, row and field (`RowFormatError` from `PromptDataset`; a `ConfigError` naming
``data.train_files[i]`` from `load_config`, before any process starts), and a row that passes both
yields a prompt of at least one token.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, reject, settings
from hypothesis import strategies as st

from hybridflow.data import (
    DataFileError,
    PromptDataset,
    RowFormatError,
    build_char_tokenizer,
    validate_row,
    write_rows,
)
from tests.fuzz._keys import override_list, valid_setup
from trainer.config import ConfigError, load_config

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
MAX_PROMPT_LENGTH = 64


def valid_row(i: int) -> dict:
    system = [{"role": "system", "content": "Add."}] if i % 2 else []
    return {
        "data_source": "toy",
        "prompt": [*system, {"role": "user", "content": f"{i}+1="}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"index": i},
    }


# JSON values of every kind, small.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)
ROLE = st.sampled_from(["user", "system", "assistant"]) | JSON
CONTENT = st.sampled_from(["", " ", "\n", "2+2=", "é€😀"]) | JSON
MESSAGE = st.fixed_dictionaries({}, optional={"role": ROLE, "content": CONTENT, "name": JSON})
PROMPT = st.lists(MESSAGE | JSON, max_size=3) | JSON
# What replaces a value, by the last part of its path.
REPLACEMENTS = {"prompt": PROMPT, 0: MESSAGE, 1: MESSAGE, "role": ROLE, "content": CONTENT}
# Paths into a row that a mutation can delete or replace.
PATHS = [
    ("data_source",),
    ("prompt",),
    ("prompt", 0),
    ("prompt", 0, "role"),
    ("prompt", 0, "content"),
    ("prompt", 1),
    ("reward_model",),
    ("reward_model", "ground_truth"),
    ("reward_model", "style"),
    ("ability",),
    ("extra_info",),
    ("notes",),
]


@st.composite
def bad_rows(draw: st.DrawFn) -> dict:
    """A valid row with one to three fields deleted or replaced (a whole prompt, a message, a value):
    mostly a row that breaks the layout, sometimes one that does not (an added field)."""
    row = valid_row(0)
    for _ in range(draw(st.integers(1, 3))):
        *parents, last = draw(st.sampled_from(PATHS))
        node = row
        for part in parents:
            child = node[part] if _has(node, part) else None
            if not isinstance(child, dict | list):
                break
            node = child
        else:
            if draw(st.booleans()) and _has(node, last):
                del node[last]
            elif isinstance(node, dict) or _has(node, last):
                node[last] = draw(REPLACEMENTS.get(last, JSON))
    return row


def _has(node: object, key: object) -> bool:
    if isinstance(node, dict):
        return key in node
    return isinstance(node, list) and isinstance(key, int) and key < len(node)


@st.composite
def files(draw: st.DrawFn) -> tuple[list[dict], int, str]:
    """Valid rows with one mutated row among them (at the index returned), and the file format."""
    rows = [valid_row(i) for i in range(draw(st.integers(1, 4)))]
    at = draw(st.integers(0, len(rows)))
    rows.insert(at, draw(bad_rows()))
    return rows, at, draw(st.sampled_from(["jsonl", "parquet"]))


def write(rows: list[dict], folder: Path, suffix: str) -> Path:
    """The rows as a file. Rows that cannot be written as parquet are no case: Arrow finds no one type
    for a column, or Parquet cannot hold it (a struct without fields, from an empty dict)."""
    try:
        return write_rows(rows, folder / f"train.{suffix}")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        reject()


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return valid_setup(tmp_path_factory.mktemp("fuzz_data"))


def row_error(path: Path, tokenizer) -> RowFormatError | DataFileError | None:
    try:
        dataset = PromptDataset(path, tokenizer, MAX_PROMPT_LENGTH)
    except (RowFormatError, DataFileError) as error:
        return error
    assert all(len(item["input_ids"]) > 0 for item in dataset), "a prompt of no tokens was kept"
    return None


@FUZZ
@given(case=files())
def test_a_bad_row_is_named_by_file_row_and_field(tmp_path_factory, tokenizer, case):
    rows, at, suffix = case
    path = write(rows, tmp_path_factory.mktemp("rows"), suffix)
    error = row_error(path, tokenizer)
    try:
        validate_row(rows[at], at)
        schema_ok = True
    except RowFormatError:
        schema_ok = False
    if not schema_ok:
        assert error is not None, f"row {at} breaks the layout but loaded: {rows[at]}"
    if error is not None:
        assert isinstance(error, RowFormatError), error
        assert error.row == at, (error, rows[at])
        assert re.match(rf"row {at} of {re.escape(str(path))}: field '{re.escape(error.field)}' \S", str(error))
        root = re.match(r"[a-z_]+", error.field)[0]
        assert root in rows[at] or "is missing" in str(error), (error, rows[at])


@FUZZ
@given(case=files())
def test_a_bad_row_is_a_config_error_before_anything_starts(tmp_path_factory, tokenizer, setup, case):
    rows, _, suffix = case
    path = write(rows, tmp_path_factory.mktemp("rows"), suffix)
    error = row_error(path, tokenizer)
    try:
        load_config(None, [*override_list(setup), f"data.train_files=[{path}]"])
    except ConfigError as config_error:
        assert error is not None, f"a config error for rows the dataset loads: {config_error}"
        assert config_error.problems == (f"data.train_files[0]: {error}",)
    else:
        assert error is None, f"the config check let through: {error}"


JSONL = "".join(json.dumps(valid_row(i)) + "\n" for i in range(3)).encode()


@FUZZ
@given(
    edits=st.lists(
        st.tuples(
            st.integers(0, len(JSONL)),
            st.integers(0, 4),
            st.binary(max_size=3) | st.sampled_from([b"\n", b"{", b"}", b'"', b",", b"[1]", b"\xff", b"\xc3"]),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_a_corrupted_jsonl_file_is_named_by_file_and_line_before_anything_starts(
    tmp_path_factory, tokenizer, setup, edits
):
    """Valid jsonl with bytes cut or inserted: a line that is not UTF-8, not JSON or not an object is
    named by file and line, the same by the dataset and by the config check."""
    text = JSONL
    for at, cut, insert in edits:
        text = text[:at] + insert + text[at + cut :]
    assume(text.strip())
    path = tmp_path_factory.mktemp("jsonl") / "train.jsonl"
    path.write_bytes(text)
    error = row_error(path, tokenizer)
    if isinstance(error, DataFileError):
        assert re.match(rf"file {re.escape(repr(str(path)))} line [1-9]\d*: \S", str(error)), error
    try:
        load_config(None, [*override_list(setup), f"data.train_files=[{path}]"])
    except ConfigError as config_error:
        assert error is not None, f"a config error for a file the dataset loads: {config_error}"
        assert config_error.problems == (f"data.train_files[0]: {error}",)
    else:
        assert error is None, f"the config check let through: {error}"
