"""Reading and writing dataset files (parquet or jsonl) in the row layout of :mod:`hybridflow.data.schema`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["DataFileError", "file_format", "read_rows", "write_rows"]

_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


class DataFileError(ValueError):
    """A dataset file cannot be read as rows; the message names the file (and the line, in jsonl)."""


def file_format(path: str | os.PathLike[str]) -> str:
    """``"parquet"`` or ``"json"`` from the file's suffix; a ValueError names the path otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(
            f"cannot tell the format of {str(path)!r}: expected a suffix among {sorted(_FORMATS)}"
        )
    return _FORMATS[suffix]


def read_rows(path: str | os.PathLike[str], cache_dir: str | None = None) -> list[dict[str, Any]]:
    """All rows of one parquet or jsonl file: parquet through Hugging Face ``datasets``, jsonl line by
    line (blank lines skipped), each row as it was written.

    Raises `DataFileError` naming the file (and for jsonl the line) when it cannot be read: a line
    that is not JSON or not an object, text that is not UTF-8, a parquet file ``datasets`` fails on.

    Args:
        path: a ``.parquet``, ``.jsonl`` or ``.json`` (one object per line) file.
        cache_dir: where ``datasets`` keeps its lock and cache files (its default cache if None).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    if file_format(path) == "json":
        return _read_jsonl(path)
    import datasets  # deferred: importing datasets takes about a second
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    # Its progress bar would land on stderr ahead of whatever a command prints there (the config
    # check reads the rows too).
    bars_were_on = not are_progress_bars_disabled()
    disable_progress_bars()
    try:
        return datasets.Dataset.from_parquet(str(path), keep_in_memory=True, cache_dir=cache_dir).to_list()
    except Exception as error:
        if _caused_by(error, UnicodeDecodeError):
            where = _first_invalid_text(path)
            if where is not None:
                row, field, reason = where
                raise DataFileError(
                    f"file {str(path)!r} row {row} field {field!r}: not UTF-8 text ({reason})"
                ) from error
        # datasets reports "An error occurred while generating the dataset"; the reason is its cause.
        reason = error.__cause__ or error
        detail = str(reason).strip().splitlines()[0] if str(reason).strip() else type(reason).__name__
        raise DataFileError(f"file {str(path)!r} cannot be read as parquet rows ({detail})") from error
    finally:
        if bars_were_on:
            enable_progress_bars()


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_invalid_text(path: Path) -> tuple[int, str, str] | None:
    """``(row, field, reason)`` of the first text value of a parquet file that is not UTF-8 (a field
    inside a struct or list named like ``reward_model.ground_truth`` or ``prompt[0].content``), or
    None if every text value decodes. Reads the file with pyarrow, which does not decode on reading."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    for name in table.column_names:
        for row, scalar in enumerate(table.column(name)):
            found = _invalid_text_in(scalar, name)
            if found is not None:
                return row, *found
    return None


def _invalid_text_in(scalar: Any, field: str) -> tuple[str, str] | None:
    import pyarrow as pa

    if not scalar.is_valid:
        return None
    if isinstance(scalar, pa.StructScalar):
        for key in scalar.type:
            found = _invalid_text_in(scalar[key.name], f"{field}.{key.name}")
            if found is not None:
                return found
        return None
    if isinstance(scalar, pa.ListScalar | pa.LargeListScalar):
        for i, item in enumerate(scalar.values):
            found = _invalid_text_in(item, f"{field}[{i}]")
            if found is not None:
                return found
        return None
    if isinstance(scalar, pa.StringScalar | pa.LargeStringScalar):
        try:
            scalar.as_py()
        except UnicodeDecodeError as error:
            return field, f"{error.reason} at byte {error.start}"
    return None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    # Read here rather than by `datasets`, whose reader fails on a bad line with "An error occurred
    # while generating the dataset", naming neither the file nor the line.
    rows = []
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            where = f"file {str(path)!r} line {number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataFileError(f"{where}: not UTF-8 text ({error.reason})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFileError(f"{where}: not valid JSON ({error.msg}, column {error.colno})") from None
            if not isinstance(row, dict):
                raise DataFileError(f"{where}: expected a JSON object (one row), got {type(row).__name__}")
            rows.append(row)
    return rows


def write_rows(rows: Iterable[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` to a parquet or jsonl file chosen by the suffix of ``path``; returns the path.

    Parquet stores dict fields as structs: every row of a column gets the union of the keys seen in
    that column (missing keys read back as None).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    fmt = file_format(path)
    rows = [dict(row) for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        with path.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
