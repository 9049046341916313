"""Reading and writing dataset files (parquet or jsonl) in the row layout of :mod:`hybridflow.data.schema`."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["file_format", "read_rows", "write_rows"]

_FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


def file_format(path: str | os.PathLike[str]) -> str:
    """``"parquet"`` or ``"json"`` from the file's suffix; a ValueError names the path otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise ValueError(
            f"cannot tell the format of {str(path)!r}: expected a suffix among {sorted(_FORMATS)}"
        )
    return _FORMATS[suffix]


def read_rows(path: str | os.PathLike[str], cache_dir: str | None = None) -> list[dict[str, Any]]:
    """All rows of one parquet or jsonl file, read through Hugging Face ``datasets``.

    Args:
        path: a ``.parquet``, ``.jsonl`` or ``.json`` (one object per line) file.
        cache_dir: where ``datasets`` keeps its lock and cache files (its default cache if None).
    """
    import datasets  # deferred: importing datasets takes about a second

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file {str(path)!r} does not exist")
    reader = datasets.Dataset.from_parquet if file_format(path) == "parquet" else datasets.Dataset.from_json
    return reader(str(path), keep_in_memory=True, cache_dir=cache_dir).to_list()


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
