"""Checkpoint store on real files: atomic marker, validated loads, fallback past torn checkpoints,
and a full disk named as such (an injected ENOSPC, and a real small tmpfs)."""

from __future__ import annotations

import errno
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.api import CheckpointException

from hybridflow.checkpoint import (
    MARKER_FILE,
    CheckpointStore,
    DiskFullError,
    IncompleteCheckpointError,
    is_disk_full,
    training_state_bytes,
)
from hybridflow.controller import WorkerError
from tests.checkpoint._small_disk import fill, small_disk

DISK_FULL = re.compile(
    r"no space left on (?P<root>\S+) while saving checkpoint step (?P<step>\d+) "
    r"\(needed ~(?P<needed>[\d.]+) MB, free (?P<free>[\d.]+) MB\)"
)


def write_shard(size: int):
    """A ``write_parts`` that writes one file of ``size`` bytes, as a worker's shard would be."""

    def write(folder: Path) -> None:
        (folder / "actor").mkdir()
        (folder / "actor" / "shard.bin").write_bytes(bytes(range(256)) * (size // 256))

    return write


def saved(root: Path, *steps: int, size: int = 4096) -> CheckpointStore:
    store = CheckpointStore(root)
    for step in steps:
        store.save(step, {"loader": {"position": step * 16}, "kl_coef": 0.1 * step}, write_shard(size))
    return store


def test_save_then_load_gives_back_the_step_and_state(tmp_path):
    store = saved(tmp_path, 2)
    checkpoint = store.load(tmp_path / "step_2")
    assert checkpoint.step == 2
    assert checkpoint.state == {"loader": {"position": 32}, "kl_coef": pytest.approx(0.2)}
    assert sorted(p.name for p in (tmp_path / "step_2").iterdir()) == ["actor", MARKER_FILE]


def test_a_half_written_marker_is_skipped_for_the_previous_checkpoint(tmp_path, caplog):
    store = saved(tmp_path, 2, 4)
    marker = tmp_path / "step_4" / MARKER_FILE
    marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])
    with caplog.at_level(logging.WARNING):
        checkpoint = store.latest()
    assert checkpoint.step == 2 and checkpoint.path == tmp_path / "step_2"
    assert f"checkpoint {tmp_path / 'step_4'} is incomplete: {MARKER_FILE} cannot be read" in caplog.text
    with pytest.raises(IncompleteCheckpointError, match=r"step_4 is incomplete: trainer_state\.pt cannot be read"):
        store.load(tmp_path / "step_4")


def test_a_zero_byte_marker_is_skipped_for_the_previous_checkpoint(tmp_path, caplog):
    store = saved(tmp_path, 2, 4)
    (tmp_path / "step_4" / MARKER_FILE).write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        assert store.latest().step == 2
    assert f"checkpoint {tmp_path / 'step_4'} is incomplete: {MARKER_FILE} is empty (0 bytes)" in caplog.text


def test_a_truncated_shard_or_an_unfinished_save_is_skipped(tmp_path, caplog):
    store = saved(tmp_path, 2, 4, 6)
    shard = tmp_path / "step_6" / "actor" / "shard.bin"
    shard.write_bytes(shard.read_bytes()[:100])
    (tmp_path / "step_4" / MARKER_FILE).unlink()
    with caplog.at_level(logging.WARNING):
        assert store.latest().step == 2
    assert "step_6 is incomplete: actor/shard.bin has 100 bytes, 4096 were written" in caplog.text
    assert "step_4 is incomplete: trainer_state.pt is missing (the save did not finish)" in caplog.text


def test_no_complete_checkpoint_means_none(tmp_path):
    assert CheckpointStore(tmp_path / "absent").latest() is None
    store = saved(tmp_path, 3)
    (tmp_path / "step_3" / MARKER_FILE).write_bytes(b"")
    assert store.latest() is None


def test_a_save_that_fails_leaves_no_marker_and_the_old_step_is_invalidated(tmp_path):
    store = saved(tmp_path, 2, 4)

    def fails_halfway(folder: Path) -> None:
        write_shard(4096)(folder)
        raise ValueError("worker lost")

    with pytest.raises(ValueError, match="worker lost"):
        store.save(4, {"loader": {}}, fails_halfway)
    # The step-4 checkpoint written before was replaced by a save that never finished.
    assert not (tmp_path / "step_4" / MARKER_FILE).exists()
    assert store.latest().step == 2
    # A marker whose state cannot be serialised fails without leaving a marker or its temporary file.
    with pytest.raises(Exception, match="lambda"):
        store.save(6, {"fn": lambda: 0}, write_shard(256))
    assert sorted(p.name for p in (tmp_path / "step_6").iterdir()) == ["actor"]


def test_an_injected_enospc_names_the_disk_full_and_removes_the_partial_checkpoint(tmp_path):
    store = saved(tmp_path, 2, size=1 << 20)

    def disk_fills(folder: Path) -> None:
        write_shard(4096)(folder)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError) as info:
        store.save(4, {"loader": {}}, disk_fills)
    match = DISK_FULL.match(str(info.value))
    assert match, str(info.value)
    assert match["root"] == str(tmp_path) and match["step"] == "4"
    # Needed: the previous checkpoint's size (1 MiB shard + marker).
    assert match["needed"] == "1.0"
    assert float(match["free"]) == pytest.approx(shutil.disk_usage(tmp_path).free / 2**20, abs=50)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value.__cause__, OSError)
    assert not (tmp_path / "step_4").exists()
    assert store.latest().step == 2


def test_a_real_full_tmpfs_is_reported_with_the_needed_and_free_space(tmp_path):
    with small_disk(tmp_path / "disk", 1 << 20) as disk:
        store = saved(disk, 1, size=256 << 10)
        # The shard itself does not fit: Python's write raises ENOSPC.
        with pytest.raises(DiskFullError) as info:
            store.save(2, {"loader": {}}, write_shard(2 << 20), size_hint_bytes=2 << 20)
        match = DISK_FULL.match(str(info.value))
        assert match and match["step"] == "2" and match["needed"] == "2.0", str(info.value)
        # The partial step_2 was removed, so the space it took is free again: 1 MiB minus step_1.
        assert 0.6 < float(match["free"]) <= 0.75
        assert not (disk / "step_2").exists()
        # Only the marker does not fit: torch.save's zip writer fails without an errno.
        fill(disk, leave_bytes=4096)
        with pytest.raises(DiskFullError, match="while saving checkpoint step 3"):
            store.save(3, {"loader": {"big": torch.zeros(4096)}}, write_shard(256))
        assert not (disk / "step_3").exists()
        assert store.latest().step == 1


def worker_error(cause: BaseException) -> WorkerError:
    return WorkerError(0, "actor_rollout", "save_checkpoint", cause, f"Traceback ...\n{type(cause).__name__}: {cause}")


def test_disk_full_is_recognised_through_worker_and_distributed_checkpoint_errors(tmp_path):
    no_space = OSError(errno.ENOSPC, "No space left on device")
    assert is_disk_full(worker_error(no_space), tmp_path, 0)
    dcp_failure = CheckpointException("save failed", {1: (no_space, None)})
    assert is_disk_full(dcp_failure, tmp_path, 0)
    # The cause could not be rebuilt on the controller: the remote traceback's text still says it.
    assert is_disk_full(
        WorkerError(1, "actor_rollout", "save_checkpoint", None, "OSError: [Errno 28] No space left on device"),
        tmp_path,
        0,
    )
    # Another failure on a disk with room to spare is not a full disk...
    assert not is_disk_full(worker_error(ValueError("bad shard")), tmp_path, 1 << 20)
    # ...but the same failure where the rest of the checkpoint cannot fit is.
    assert is_disk_full(worker_error(ValueError("bad shard")), tmp_path, shutil.disk_usage(tmp_path).free + 1)


def test_training_state_estimate_is_three_copies_of_the_weights_per_trained_model(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1000)
    (tmp_path / "config.json").write_text("{}")
    assert training_state_bytes(tmp_path) == 3000
    assert training_state_bytes(tmp_path, trained_models=2) == 6000
