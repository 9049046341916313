"""`RolloutStore`: one step's rollout rows kept where they were generated, by row id.

``generate_sequences(..., keep=RolloutKeep(...))`` stores the token columns of every row it generated
on every rank, under ``first_id + global row index``, and answers with the response-side columns and
``rollout_ids`` only. The training-layout methods then take ``rollout_ids`` in place of the stored
columns and join them back here, so the prompt and token columns travel controller -> workers once per
step instead of once per call. The controller keeps a store of the same rows to tell which columns it
may leave out (`trainer.steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.protocol import Batch
from hybridflow.rollout.concat import concat_rollouts
from workers.training import MODEL_INPUTS

__all__ = ["HELD_COLUMNS", "RolloutKeep", "RolloutStore"]

HELD_COLUMNS = MODEL_INPUTS
"""The columns the workers keep: what every training-layout forward reads."""


@dataclass(frozen=True)
class RolloutKeep:
    """Ask `generate_sequences` to keep its rollouts on the workers.

    Attributes:
        step: the training step the rows belong to; keeping rows of a later step drops the earlier ones.
        first_id: the id of the call's first row; row ``i`` (in dp order) gets ``first_id + i``.
        pad_token_id: fills ``input_ids`` when rows of calls with different prompt widths are joined.
        rows: the call's rows (prompts x samples). A batch the dp size does not divide is padded at its
            end, and the padding rows' samples (ids from ``first_id + rows`` on) are not kept, so the
            next call of the step may start its ids there.
    """

    step: int
    first_id: int
    pad_token_id: int
    rows: int


class RolloutStore:
    """Rows of one step's rollouts by int64 row id; `put` for another step drops what was held.

    Args:
        pad_token_id: fills ``input_ids`` when `rows` joins rows of different prompt widths.
    """

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id
        self.step: int | None = None
        self._parts: list[Batch] = []
        self._ids = torch.empty(0, dtype=torch.long)  # the ids of all held rows, parts in order

    def __len__(self) -> int:
        return len(self._ids)

    def put(self, step: int, ids: torch.Tensor, rows: Batch) -> None:
        """Hold ``rows`` under ``ids [rows]`` for ``step``; rows of any other step are dropped first.

        Raises:
            ValueError: when ``ids`` and ``rows`` differ in length or an id is already held.
        """
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        if len(ids) != len(rows):
            raise ValueError(f"{len(ids)} ids for {len(rows)} rows")
        if step != self.step:
            self.step, self._parts, self._ids = step, [], torch.empty(0, dtype=torch.long)
        held = ids[torch.isin(ids, self._ids)]
        if len(held) or len(ids.unique()) != len(ids):
            raise ValueError(f"step {step}: row ids must be new and distinct; already held: {_shown(held)}")
        self._parts.append(rows.select(*rows.keys(), meta=False))
        self._ids = torch.cat([self._ids, ids])

    def next_id(self, step: int) -> int:
        """The first id not yet used in ``step``: 0 for a step the store does not hold."""
        return int(self._ids.max()) + 1 if step == self.step and len(self._ids) else 0

    def holds(self, ids: torch.Tensor) -> bool:
        """Whether every id of ``ids`` is held."""
        return bool(torch.isin(torch.as_tensor(ids).cpu(), self._ids).all())

    def rows(self, ids: torch.Tensor) -> Batch:
        """The held rows in the order of ``ids [rows]`` (repeats allowed).

        Rows of different `put` calls may differ in prompt width; the prompt columns come left-padded to
        the widest among the requested rows (`concat_rollouts`), as a controller joining those calls'
        rollouts pads them.

        Raises:
            KeyError: naming the ids that are not held (rows of an earlier step are dropped).
        """
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
        if not len(ids):
            raise KeyError("no rollout ids given")
        missing = ids[~torch.isin(ids, self._ids)]
        if len(missing):
            raise KeyError(
                f"no rollout rows held for ids {_shown(missing)} (holding {len(self)} rows of step {self.step}); "
                "rows of an earlier step are dropped once a later step keeps its rollouts"
            )
        order = self._ids.argsort()
        where = order[torch.searchsorted(self._ids[order], ids)]  # index into all held rows
        sizes = torch.tensor([len(part) for part in self._parts])
        part_of = torch.repeat_interleave(torch.arange(len(self._parts)), sizes)[where]
        local = where - (sizes.cumsum(0) - sizes)[part_of]
        pieces, positions = [], []
        for part in part_of.unique().tolist():
            chosen = torch.nonzero(part_of == part).flatten()
            pieces.append(self._parts[part].reorder(local[chosen]))
            positions.append(chosen)
        return concat_rollouts(pieces, self.pad_token_id).reorder(torch.cat(positions).argsort())


def _shown(ids: torch.Tensor, limit: int = 8) -> str:
    """``ids`` as a short list for an error message."""
    values = ids.tolist()
    return f"{values[:limit]}{f' and {len(values) - limit} more' if len(values) > limit else ''}"
