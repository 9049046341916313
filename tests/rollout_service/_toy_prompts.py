"""The toy prompt loader the prompt-stream tests share: ``"<i>="`` prompts, batches of 3, seed 5."""

from __future__ import annotations

from pathlib import Path

from hybridflow.data import PromptDataset, PromptLoader, write_rows
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.protocol import Batch


def toy_loader(folder: Path, rows: int) -> PromptLoader:
    """A shuffled loader of ``rows`` prompts ``"0=" .. "<rows-1>="`` in batches of 3, written under ``folder``."""
    data = [
        {"data_source": "toy", "prompt": [{"role": "user", "content": f"{i}="}], "reward_model": {"ground_truth": "1"}}
        for i in range(rows)
    ]
    write_rows(data, folder / "rows.jsonl")
    dataset = PromptDataset(folder / "rows.jsonl", build_char_tokenizer(), max_prompt_length=8)
    return PromptLoader(dataset, batch_size=3, pad_token_id=0, seed=5)


def ids(batch: Batch) -> list[int]:
    """The batch's dataset indices (its ``index`` column)."""
    return [int(i) for i in batch["index"]]
