"""Disk space around a checkpoint: free space, sizes, and telling a full disk from other failures.

A full disk does not always say so. Python's writes raise ``OSError(ENOSPC)``; ``torch.save`` instead
reports a zip-writer position mismatch (``unexpected pos ... vs ...``) with no errno; a distributed
checkpoint written by worker processes reaches the controller as a ``WorkerError`` wrapping the
worker's exception. So a failed save counts as a full disk when ENOSPC (or its text) appears anywhere
in the error's chain, or when the file system has less space left than the rest of the checkpoint needs.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = ["free_bytes", "is_disk_full", "tree_bytes"]

_NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NO_SPACE_TEXTS = ("no space left on device", "disk quota exceeded")

_MIN_REMAINING_BYTES = 64 << 10
"""The least a failed save is assumed to still need; below it an error is a full disk."""


def free_bytes(path: Path) -> int:
    """Bytes available to this user on the file system holding ``path`` (or its nearest existing parent)."""
    existing = Path(path).absolute()
    while not existing.exists():
        existing = existing.parent
    return shutil.disk_usage(existing).free


def tree_bytes(path: Path) -> int:
    """Total size in bytes of the files under ``path`` (0 if it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(child.stat().st_size for child in path.rglob("*") if child.is_file())


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it carries: causes, contexts, a ``WorkerError``'s remote
    ``cause``, and the per-rank failures of a distributed-checkpoint exception."""
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        pending += [item.__cause__, item.__context__, getattr(item, "cause", None)]
        failures = getattr(item, "failures", None)
        if isinstance(failures, Mapping):
            # torch.distributed.checkpoint: rank -> (exception, traceback)
            pending += [failure[0] if isinstance(failure, tuple) else failure for failure in failures.values()]


def is_disk_full(error: BaseException, target: Path, remaining_bytes: int) -> bool:
    """Whether ``error``, raised while writing under ``target``, comes from a full file system.

    Args:
        error: what the save raised.
        target: the folder being written.
        remaining_bytes: an estimate of what the save still had to write when it failed.
    """
    for item in _chain(error):
        if isinstance(item, OSError) and item.errno in _NO_SPACE_ERRNOS:
            return True
        text = str(item).lower()
        if any(marker in text for marker in _NO_SPACE_TEXTS):
            return True
    return free_bytes(target) < max(remaining_bytes, _MIN_REMAINING_BYTES)
