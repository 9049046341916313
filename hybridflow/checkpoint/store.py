"""`CheckpointStore`: the ``step_{k}`` folders of a run, saved so that a failure never leaves one that
looks complete, and searched for the newest complete one when resuming."""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.checkpoint.disk import free_bytes, is_disk_full, tree_bytes
from hybridflow.checkpoint.errors import DiskFullError, IncompleteCheckpointError
from hybridflow.checkpoint.marker import MARKER_FILE, read_marker, sync_tree, write_marker
from hybridflow.checkpoint.run_identity import RunIdentity

__all__ = ["Checkpoint", "CheckpointStore"]

log = logging.getLogger(__name__)

_STEP_FOLDER = re.compile(r"step_(\d+)")


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its folder, its training step, the state saved with its marker and the
    run it belongs to (None for a checkpoint written before run identities)."""

    path: Path
    step: int
    state: Mapping[str, Any]
    run: RunIdentity | None = None


class CheckpointStore:
    """Checkpoints under ``root``, one folder per step: ``root/step_{k}``.

    A checkpoint is complete once its marker (``trainer_state.pt``, :mod:`hybridflow.checkpoint.marker`)
    is written; `save` writes it last, and only after every other file is flushed to the disk.
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path_of(self, step: int) -> Path:
        """The folder of the checkpoint of ``step``."""
        return self.root / f"step_{step}"

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        write_parts: Callable[[Path], None],
        size_hint_bytes: int = 0,
        run: RunIdentity | None = None,
    ) -> Path:
        """Write the checkpoint of ``step``: ``write_parts(folder)`` writes its files, then the marker
        holding ``state`` (plain Python data and tensors) and ``run`` (the run it belongs to) is
        written. Returns the folder.

        If anything fails, the folder holds no marker, so it is never taken for a complete checkpoint.
        A failure caused by a full disk also removes the folder and raises `DiskFullError` naming the
        step, the space needed (the largest of ``size_hint_bytes``, the newest complete checkpoint and
        what was written before the failure) and the space left.
        """
        path = self.path_of(step)
        # A run resumed from an earlier checkpoint writes this step again: the old folder goes first,
        # so none of its files can pass for part of the new checkpoint.
        shutil.rmtree(path, ignore_errors=True)
        try:
            path.mkdir(parents=True, exist_ok=True)
            write_parts(path)
            sync_tree(path)
            write_marker(path, step, state, run)
        except BaseException as error:
            written = tree_bytes(path)
            needed = max(size_hint_bytes, self._newest_complete_bytes(), written)
            if not is_disk_full(error, path, needed - written):
                raise
            shutil.rmtree(path, ignore_errors=True)
            raise DiskFullError(path, step, needed, free_bytes(self.root)) from error
        return path

    def load(self, path: str | Path) -> Checkpoint:
        """The checkpoint in folder ``path``, after checking that it is complete.

        Raises:
            IncompleteCheckpointError: naming the folder and what is wrong with it
                (`CorruptCheckpointError` for a file whose checksum changed, naming the file).
        """
        path = Path(path)
        if not path.is_dir():
            raise IncompleteCheckpointError(path, "no such folder")
        step, state, run = read_marker(path)
        return Checkpoint(path, step, state, run)

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint under ``root`` (None if there is none).

        Newer folders that are incomplete (a save cut short, a torn or empty marker, a missing file)
        or corrupt (a file whose CRC-32 changed since it was written) are skipped, each with a warning
        naming it and what is wrong.
        """
        for _, path in sorted(self._step_folders(), reverse=True):
            try:
                return self.load(path)
            except IncompleteCheckpointError as error:
                log.warning("skipping %s; falling back to an earlier checkpoint", error)
        return None

    def steps(self) -> list[int]:
        """The steps of the ``step_{k}`` folders under ``root``, complete or not, in order (no file is read)."""
        return sorted(step for step, _ in self._step_folders())

    def _step_folders(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        return [
            (int(match.group(1)), child)
            for child in self.root.iterdir()
            if child.is_dir() and (match := _STEP_FOLDER.fullmatch(child.name))
        ]

    def _newest_complete_bytes(self) -> int:
        for _, path in sorted(self._step_folders(), reverse=True):
            if (path / MARKER_FILE).is_file():
                return tree_bytes(path)
        return 0
