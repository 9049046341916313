"""Checkpoints of a run: save without ever leaving a torn one behind, resume from the newest complete one.

::

    store = CheckpointStore("outputs/run/checkpoints")
    store.save(step, {"loader": loader.state_dict()}, write_parts=lambda folder: ...)
    checkpoint = store.latest()          # newest complete checkpoint, or None
    checkpoint.step, checkpoint.state

See :mod:`hybridflow.checkpoint.store` (folders, saving, the resume search),
:mod:`hybridflow.checkpoint.marker` (the atomic completion marker),
:mod:`hybridflow.checkpoint.run_identity` (the run a checkpoint belongs to) and
:mod:`hybridflow.checkpoint.disk` (disk-full detection).
"""

from hybridflow.checkpoint.disk import free_bytes, is_disk_full, tree_bytes
from hybridflow.checkpoint.errors import (
    CheckpointError,
    CorruptCheckpointError,
    DiskFullError,
    IncompleteCheckpointError,
)
from hybridflow.checkpoint.marker import MARKER_FILE, Marker, file_checksum, read_marker, write_marker
from hybridflow.checkpoint.run_identity import (
    RUN_FILE,
    RunIdentity,
    differing_keys,
    flat_config,
    new_run_id,
    read_run_file,
    write_run_file,
)
from hybridflow.checkpoint.sizing import training_state_bytes
from hybridflow.checkpoint.store import Checkpoint, CheckpointStore

__all__ = [
    "MARKER_FILE",
    "RUN_FILE",
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "CorruptCheckpointError",
    "DiskFullError",
    "IncompleteCheckpointError",
    "Marker",
    "RunIdentity",
    "differing_keys",
    "file_checksum",
    "flat_config",
    "free_bytes",
    "is_disk_full",
    "new_run_id",
    "read_marker",
    "read_run_file",
    "training_state_bytes",
    "tree_bytes",
    "write_marker",
    "write_run_file",
]
