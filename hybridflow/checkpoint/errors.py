"""Errors of the checkpoint store; each names the checkpoint (or target folder) it is about."""

from __future__ import annotations

import errno
from pathlib import Path

__all__ = ["CheckpointError", "CorruptCheckpointError", "DiskFullError", "IncompleteCheckpointError"]


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read."""


class IncompleteCheckpointError(CheckpointError):
    """A checkpoint folder that is not a complete, loadable checkpoint.

    Attributes:
        path: the checkpoint folder.
        reason: what is wrong with it, e.g. ``trainer_state.pt is empty (0 bytes)``.
    """

    _STATE = "incomplete"

    def __init__(self, path: Path, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"checkpoint {self.path} is {self._STATE}: {reason}")


class CorruptCheckpointError(IncompleteCheckpointError):
    """A checkpoint folder whose files are all there with their sizes, but one of them no longer has
    the checksum it was written with (bits flipped or zeroed on the disk, a copy gone wrong).
    Skipped on resume like an incomplete one.

    Attributes:
        path: the checkpoint folder.
        file: the changed file, relative to the folder.
        reason: what is wrong, naming the file.
    """

    _STATE = "corrupt"

    def __init__(self, path: Path, file: str, reason: str) -> None:
        self.file = file
        super().__init__(path, reason)


class DiskFullError(OSError):
    """The file system ran out of space while a checkpoint was written.

    An ``OSError`` with ``errno`` ENOSPC, so ``except OSError`` handlers see it as the disk error it is.

    Attributes:
        path: the checkpoint folder being written (already removed again).
        step: the training step of the checkpoint.
        needed_bytes: an estimate of the checkpoint's size.
        free_bytes: space left on the file system once the partial checkpoint was removed.
    """

    def __init__(self, path: Path, step: int, needed_bytes: int, free_bytes: int) -> None:
        self.path = Path(path)
        self.step = step
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.message = (
            f"no space left on {self.path.parent} while saving checkpoint step {step} "
            f"(needed ~{_megabytes(needed_bytes)} MB, free {_megabytes(free_bytes)} MB); "
            f"the partial checkpoint {self.path.name} was removed"
        )
        super().__init__(errno.ENOSPC, self.message)

    def __str__(self) -> str:
        return self.message


def _megabytes(size: int) -> str:
    return f"{size / 2**20:.1f}"
