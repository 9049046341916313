"""`PromptDataset`: validated, templated and tokenized prompts from parquet or jsonl files."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from hybridflow.data.chat import render_prompt
from hybridflow.data.files import read_rows
from hybridflow.data.schema import RowFormatError, validate_row

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["PromptDataset", "read_prompt_rows"]

logger = logging.getLogger(__name__)

# Filtered rows named in the warning; the rest are counted.
_ROWS_NAMED = 5


def read_prompt_rows(
    path: str | os.PathLike[str], prompt_key: str = "prompt", cache_dir: str | None = None
) -> list[dict[str, Any]]:
    """The rows of one dataset file as `PromptDataset` takes them: the ``prompt_key`` column read as
    the layout's ``prompt`` field, every row checked against :mod:`hybridflow.data.schema`.

    Raises:
        DataFileError: the file cannot be read as rows (names the file, and the line in jsonl).
        RowFormatError: a row breaks the layout (names the file, row and field).
    """
    rows = []
    for i, row in enumerate(read_rows(path, cache_dir=cache_dir)):
        if prompt_key != "prompt":
            if row.get(prompt_key) is None:
                raise RowFormatError(i, prompt_key, "is missing (the data.prompt_key column)", str(path))
            row = {**row, "prompt": row[prompt_key]}
        validate_row(row, i, where=str(path))
        rows.append(row)
    return rows


class PromptDataset(Dataset):
    """Prompts for RL rollouts, one item per kept row of the given files.

    Every row is read by :func:`read_prompt_rows` and checked against :mod:`hybridflow.data.schema` (a
    bad row raises :class:`~hybridflow.data.schema.RowFormatError` naming the file, row and field; an
    unreadable file :class:`~hybridflow.data.files.DataFileError`), rendered with the tokenizer's chat
    template (or the plain fallback of :func:`~hybridflow.data.chat.render_plain`) and tokenized
    without adding special tokens (the template carries them). A prompt of no tokens is a
    `RowFormatError`; prompts longer than ``max_prompt_length`` tokens are dropped, and how many is
    logged and kept in ``num_filtered``.

    Each item is a dict:

    - ``input_ids``: int64 numpy array ``[prompt_len]``, ``prompt_len <= max_prompt_length``;
    - ``raw_prompt``: the chat messages; ``ground_truth``: ``reward_model["ground_truth"]``;
    - ``data_source`` (str), ``ability`` (str or None), ``extra_info`` (dict, ``{}`` when absent);
    - ``index``: the row's position among all loaded rows (files in order), counted before filtering.

    Args:
        files: one path or a list of ``.parquet`` / ``.jsonl`` paths.
        tokenizer: a Hugging Face tokenizer.
        max_prompt_length: longest prompt kept, in tokens.
        cache_dir: cache directory handed to ``datasets`` (its default if None).
        prompt_key: the column holding each row's prompt (chat messages); it is read as the layout's
            ``prompt`` field (``data.prompt_key``).
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        tokenizer: PreTrainedTokenizerBase,
        max_prompt_length: int,
        cache_dir: str | None = None,
        prompt_key: str = "prompt",
    ) -> None:
        if max_prompt_length < 1:
            raise ValueError(f"max_prompt_length must be >= 1, got {max_prompt_length}")
        paths = [files] if isinstance(files, str | os.PathLike) else list(files)
        if not paths:
            raise ValueError("PromptDataset needs at least one file")
        rows: list[dict[str, Any]] = []
        origins: list[tuple[str, int]] = []  # (file, row in the file) of each row
        for path in paths:
            file_rows = read_prompt_rows(path, prompt_key, cache_dir)
            rows.extend(file_rows)
            origins.extend((str(path), i) for i in range(len(file_rows)))

        texts = [render_prompt(tokenizer, row["prompt"]) for row in rows]
        token_ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        empty = next((i for i, ids in enumerate(token_ids) if len(ids) == 0), None)
        if empty is not None:
            # Generation needs at least one token to continue from.
            where, row = origins[empty]
            raise RowFormatError(
                row, "prompt", "renders to no tokens with the tokenizer's chat template", where
            )

        self.max_prompt_length = max_prompt_length
        self.num_loaded = len(rows)
        self.filtered_indices: tuple[int, ...] = tuple(
            i for i, ids in enumerate(token_ids) if len(ids) > max_prompt_length
        )
        self.num_filtered = len(self.filtered_indices)
        if self.num_filtered:
            longest = max(len(token_ids[i]) for i in self.filtered_indices)
            named = [f"{origins[i][0]} row {origins[i][1]}" for i in self.filtered_indices[:_ROWS_NAMED]]
            more = f" and {self.num_filtered - _ROWS_NAMED} more" if self.num_filtered > _ROWS_NAMED else ""
            logger.warning(
                "filtered %d of %d prompts longer than max_prompt_length=%d tokens (longest %d): %s%s",
                self.num_filtered,
                self.num_loaded,
                max_prompt_length,
                longest,
                ", ".join(named),
                more,
            )
        dropped = set(self.filtered_indices)
        self._items = [
            {
                "input_ids": np.asarray(token_ids[i], dtype=np.int64),
                "raw_prompt": row["prompt"],
                "ground_truth": row["reward_model"]["ground_truth"],
                "data_source": row["data_source"],
                "ability": row.get("ability"),
                "extra_info": row.get("extra_info") or {},
                "index": i,
            }
            for i, row in enumerate(rows)
            if i not in dropped
        ]
        if not self._items:
            raise ValueError(
                f"no prompts left: all {self.num_loaded} rows of {[str(p) for p in paths]} are longer "
                f"than max_prompt_length={max_prompt_length} tokens or the files are empty"
            )
        logger.info("loaded %d prompts (%d filtered) from %s", len(self._items), self.num_filtered, paths)

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._items[i]
