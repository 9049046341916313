"""Checksums in the checkpoint marker: a file changed in place with its size kept is found on loading,
named with its folder, and resume falls back to the previous checkpoint; markers written before
checksums still load."""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

import pytest
import torch

from hybridflow.checkpoint import MARKER_FILE, CheckpointStore, CorruptCheckpointError, file_checksum


def write_shards(folder: Path) -> None:
    """Two files as a worker would write them: a 3 MiB shard (past one read block) and a small state."""
    (folder / "actor").mkdir()
    (folder / "actor" / "shard.bin").write_bytes(os.urandom(3 << 20))
    (folder / "actor" / "actor_state.pt").write_bytes(b"schedule" * 10)


def saved(root: Path, *steps: int) -> CheckpointStore:
    store = CheckpointStore(root)
    for step in steps:
        store.save(step, {"loader": {"position": step * 16}}, write_shards)
    return store


def zero_the_middle(path: Path, length: int = 4096) -> None:
    size = path.stat().st_size
    with path.open("r+b") as file:
        file.seek(size // 2)
        file.write(bytes(length))
    assert path.stat().st_size == size


def test_the_marker_holds_each_file_s_crc32(tmp_path):
    saved(tmp_path, 1)
    folder = tmp_path / "step_1"
    payload = torch.load(folder / MARKER_FILE, weights_only=True)
    shard = (folder / "actor" / "shard.bin").read_bytes()
    assert payload["crc32"] == {
        "actor/actor_state.pt": zlib.crc32(b"schedule" * 10),
        "actor/shard.bin": zlib.crc32(shard),
    }
    assert file_checksum(folder / "actor" / "shard.bin") == zlib.crc32(shard)


def test_a_same_size_corrupted_file_is_skipped_with_its_name_and_the_previous_checkpoint_loads(
    tmp_path, caplog
):
    store = saved(tmp_path, 2, 4)
    zero_the_middle(tmp_path / "step_4" / "actor" / "shard.bin")
    with caplog.at_level(logging.WARNING, logger="hybridflow.checkpoint"):
        checkpoint = store.latest()
    assert (checkpoint.step, checkpoint.state["loader"]["position"]) == (2, 32)
    assert (
        f"skipping checkpoint {tmp_path / 'step_4'} is corrupt: actor/shard.bin has changed since it was written"
        in caplog.text
    )
    with pytest.raises(CorruptCheckpointError) as info:
        store.load(tmp_path / "step_4")
    assert (info.value.path, info.value.file) == (tmp_path / "step_4", "actor/shard.bin")
    assert "its size is the same" in str(info.value)


def test_a_flipped_bit_in_a_small_file_is_found(tmp_path):
    store = saved(tmp_path, 1)
    state = tmp_path / "step_1" / "actor" / "actor_state.pt"
    data = bytearray(state.read_bytes())
    data[5] ^= 0x01
    state.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match=r"step_1 is corrupt: actor/actor_state\.pt has changed"):
        store.load(tmp_path / "step_1")
    assert store.latest() is None


def test_a_marker_written_before_checksums_still_loads_with_a_note(tmp_path, caplog):
    store = saved(tmp_path, 3)
    folder = tmp_path / "step_3"
    payload = torch.load(folder / MARKER_FILE, weights_only=True)
    old = {"format": 1, "step": 3, "files": payload["files"], "state": payload["state"]}
    torch.save(old, folder / MARKER_FILE)
    zero_the_middle(folder / "actor" / "shard.bin")  # what only a checksum could see
    with caplog.at_level(logging.WARNING, logger="hybridflow.checkpoint"):
        checkpoint = store.latest()
    assert (checkpoint.step, checkpoint.state["loader"]["position"]) == (3, 48)
    assert f"checkpoint {folder} was written without checksums" in caplog.text
    assert "checked by size only" in caplog.text
