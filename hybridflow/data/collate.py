"""Turning a list of dataset items into a left-padded prompt `Batch`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hybridflow.protocol import Batch

__all__ = ["NON_TENSOR_COLUMNS", "PromptCollator"]

# Columns copied one-to-one from the dataset items into the Batch.
NON_TENSOR_COLUMNS = ("raw_prompt", "ground_truth", "data_source", "extra_info", "index")


class PromptCollator:
    """Collate function for :class:`~hybridflow.data.dataset.PromptDataset` items.

    Prompts are left-padded (the generation continues on the right) to the longest prompt of the
    batch, or to ``pad_to`` tokens when given (fixed shapes across steps).

    The Batch holds

    - ``input_ids [batch, prompt_len]`` int64, ``pad_token_id`` on the left;
    - ``attention_mask [batch, prompt_len]`` int64, 1 on real tokens;
    - ``position_ids [batch, prompt_len]`` int64, 0 at the first real token, 0 on padding;
    - non-tensor columns ``raw_prompt``, ``ground_truth``, ``data_source``, ``extra_info``,
      ``index`` (int) and ``uid`` (``str(index)``, the prompt's id for grouping its samples).

    Args:
        pad_token_id: token id written into the padding.
        pad_to: fixed prompt length; a prompt longer than this raises a ValueError naming its index.
    """

    def __init__(self, pad_token_id: int, pad_to: int | None = None) -> None:
        if pad_to is not None and pad_to < 1:
            raise ValueError(f"pad_to must be >= 1 or None, got {pad_to}")
        self.pad_token_id = pad_token_id
        self.pad_to = pad_to

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> Batch:
        if not items:
            raise ValueError("cannot collate an empty list of prompts")
        lengths = [len(item["input_ids"]) for item in items]
        width = max(lengths) if self.pad_to is None else self.pad_to
        too_long = [item["index"] for item, n in zip(items, lengths, strict=True) if n > width]
        if too_long:
            raise ValueError(f"prompts with index {too_long} are longer than pad_to={self.pad_to} tokens")
        input_ids = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, (item, n) in enumerate(zip(items, lengths, strict=True)):
            if n:
                input_ids[row, width - n :] = torch.as_tensor(item["input_ids"], dtype=torch.long)
                attention_mask[row, width - n :] = 1
        position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        non_tensors = {key: [item[key] for item in items] for key in NON_TENSOR_COLUMNS}
        non_tensors["uid"] = [str(item["index"]) for item in items]
        return Batch(
            {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
            non_tensors,
        )
