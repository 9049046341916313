"""The completion marker of a checkpoint: written last, atomically, and validated when read.

A checkpoint folder counts as complete only when its marker file exists, loads, and lists every
other file of the folder with the size it had when the marker was written. The marker is written to
a temporary file, flushed to the disk, and renamed into place, so a crash or a full disk leaves either
no marker or a whole one, never a torn one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from hybridflow.checkpoint.errors import IncompleteCheckpointError

__all__ = ["MARKER_FILE", "list_files", "read_marker", "sync_tree", "write_marker"]

MARKER_FILE = "trainer_state.pt"
"""Name of the marker file inside a checkpoint folder."""

_FORMAT = 1


def list_files(directory: Path) -> dict[str, int]:
    """Every file under ``directory`` (relative POSIX path -> size in bytes), the marker excluded."""
    return {
        path.relative_to(directory).as_posix(): path.stat().st_size
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name != MARKER_FILE and not path.name.startswith(f".{MARKER_FILE}.")
    }


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def sync_tree(directory: Path) -> None:
    """Flush every file and folder under ``directory`` (itself included) to the disk."""
    for path in [*sorted(directory.rglob("*")), directory]:
        _fsync(path)


def write_marker(directory: Path, step: int, state: Mapping[str, Any]) -> Path:
    """Write ``directory/trainer_state.pt`` atomically; returns its path.

    The marker holds ``step``, the caller's ``state`` (plain Python data and tensors) and the list of
    the folder's other files with their sizes, so call it after everything else is written.
    """
    payload = {"format": _FORMAT, "step": step, "files": list_files(directory), "state": dict(state)}
    final = directory / MARKER_FILE
    temporary = directory / f".{MARKER_FILE}.{os.getpid()}.tmp"
    try:
        with temporary.open("wb") as file:
            torch.save(payload, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    # The rename itself is durable only once the folder's entry is flushed.
    _fsync(directory)
    return final


def read_marker(directory: Path) -> tuple[int, dict[str, Any]]:
    """The ``(step, state)`` that `write_marker` stored in ``directory``, after checking the folder.

    Raises:
        IncompleteCheckpointError: the marker is missing, empty, unreadable or malformed, or a file it
            lists is missing or has another size (each case says which).
    """
    path = directory / MARKER_FILE
    if not path.is_file():
        raise IncompleteCheckpointError(directory, f"{MARKER_FILE} is missing (the save did not finish)")
    if path.stat().st_size == 0:
        raise IncompleteCheckpointError(directory, f"{MARKER_FILE} is empty (0 bytes)")
    try:
        payload = torch.load(path, weights_only=True)
    except Exception as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise IncompleteCheckpointError(directory, f"{MARKER_FILE} cannot be read ({first_line})") from None
    if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
        raise IncompleteCheckpointError(directory, f"{MARKER_FILE} is not a checkpoint marker of this version")
    step, files, state = payload.get("step"), payload.get("files"), payload.get("state")
    if not isinstance(step, int) or not isinstance(files, dict) or not isinstance(state, dict):
        raise IncompleteCheckpointError(directory, f"{MARKER_FILE} lacks its step, file list or state")
    for name, size in files.items():
        part = directory / name
        if not part.is_file():
            raise IncompleteCheckpointError(directory, f"{name} is missing")
        if part.stat().st_size != size:
            raise IncompleteCheckpointError(
                directory, f"{name} has {part.stat().st_size} bytes, {size} were written"
            )
    return step, state
