"""`PromptLoader`: a dataset, a resumable sampler and the collator, yielding prompt Batches."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hybridflow.data.collate import PromptCollator
from hybridflow.data.sampler import ResumableBatchSampler
from hybridflow.protocol import Batch

__all__ = ["PromptLoader"]


class PromptLoader:
    """Iterates prompt Batches in the order of a :class:`ResumableBatchSampler`.

    Everything runs in the calling process (the dataset is tokenized up front, so there is no work to
    hide in background workers), which keeps ``state_dict`` exact: it never counts prefetched batches.

    Args:
        dataset: indexable items as produced by :class:`~hybridflow.data.dataset.PromptDataset`.
        batch_size: prompts per Batch.
        pad_token_id: the tokenizer's pad token id.
        seed, shuffle, drop_last: see :class:`ResumableBatchSampler`.
        pad_to: fixed prompt length, see :class:`PromptCollator`.
    """

    def __init__(
        self,
        dataset: Sequence[Mapping[str, Any]],
        batch_size: int,
        pad_token_id: int,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
        pad_to: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.sampler = ResumableBatchSampler(len(dataset), batch_size, seed, shuffle, drop_last)
        self.collate = PromptCollator(pad_token_id, pad_to)

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.sampler)

    def __iter__(self) -> Iterator[Batch]:
        """The remaining Batches of the current epoch (see :class:`ResumableBatchSampler`)."""
        for indices in self.sampler:
            yield self.collate([self.dataset[i] for i in indices])

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state)
