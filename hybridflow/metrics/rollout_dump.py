"""The rows each step trained on, one JSON-lines file per step: ``<folder>/step_<k>.jsonl``.

One line per row, in the step's row order: ``index`` (the prompt's row in the data, the ``index``
column of `hybridflow.data.PromptDataset`), ``response_length`` (tokens) and, where the step's rows hold
them, ``policy_version`` (the weights that sampled it), ``score`` and ``response_text``. Rows of partial
rollouts, whose tokens can come from several policy versions (their ``token_versions`` column), also get
``token_versions``: ``[oldest, newest]`` version among the row's response tokens (``[]`` for an empty
response). A file is
written whole or not at all (a temporary file, then a rename), so a run killed mid-write leaves the
previous state. `RolloutDump.rewind` removes the files of the steps a resumed run trains again, so the
folder always describes the run whose weights survive: each step once.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from hybridflow.contract import TOKEN_VERSIONS
from hybridflow.protocol import Batch

__all__ = ["ROLLOUT_DUMP_DIR", "RolloutDump", "read_rollout_dump"]

ROLLOUT_DUMP_DIR = "rollouts"
"""The dump's folder under a run's output folder (``trainer.rollout_dump``)."""

_STEP_FILE = re.compile(r"step_(\d+)\.jsonl")
_OPTIONAL = (("policy_version", "policy_version"), ("score", "scores"), ("response_text", "response_text"))
"""Each optional field of a line and the rollouts' column it comes from."""


class RolloutDump:
    """Writes ``folder/step_<k>.jsonl`` per step (module docstring).

    Args:
        folder: where the files go (made on first use).
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def write(self, step: int, rollouts: Batch) -> Path:
        """Write step ``step``'s rows (``response_mask [rows, response_len]`` and ``index [rows]``
        required); returns the file."""
        lengths = rollouts["response_mask"].sum(-1).tolist()
        optional = {key: list(rollouts[column]) for key, column in _OPTIONAL if column in rollouts}
        if TOKEN_VERSIONS in rollouts:
            optional["token_versions"] = _version_ranges(rollouts[TOKEN_VERSIONS], rollouts["response_mask"])
        lines = [
            json.dumps(
                {
                    "index": int(index),
                    "response_length": int(length),
                    **{key: _plain(values[row]) for key, values in optional.items()},
                }
            )
            for row, (index, length) in enumerate(zip(rollouts["index"], lengths, strict=True))
        ]
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"step_{step}.jsonl"
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        os.replace(temporary, path)
        return path

    def rewind(self, step: int) -> None:
        """Remove the files of ``step`` and every later step (and any temporary file a crash left)."""
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            match = _STEP_FILE.fullmatch(path.name)
            if (match is not None and int(match.group(1)) >= step) or path.name.endswith(".jsonl.tmp"):
                path.unlink()


def read_rollout_dump(folder: str | Path) -> dict[int, list[dict]]:
    """The rows of every step file under ``folder``, by step, each row a dict (`RolloutDump.write`)."""
    steps = {}
    for path in Path(folder).iterdir():
        if (match := _STEP_FILE.fullmatch(path.name)) is not None:
            steps[int(match.group(1))] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return dict(sorted(steps.items()))


def _version_ranges(versions: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """``[oldest, newest]`` of each row's response-token versions (``versions``, ``mask``: ``[rows,
    response_len]``), ``[]`` where the row has no response token."""
    return [
        [int(row[keep].min()), int(row[keep].max())] if bool(keep.any()) else []
        for row, keep in zip(versions, mask.bool(), strict=True)
    ]


def _plain(value: object) -> object:
    """A JSON-ready scalar: numpy and torch scalars (0-d tensors included) become Python values."""
    return value.item() if hasattr(value, "item") else value
