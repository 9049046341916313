"""The run a checkpoint belongs to: its identity in the marker (format 3), the hash, the differing keys."""

from __future__ import annotations

import hashlib
import logging

import pytest
import torch

from hybridflow.checkpoint import (
    MARKER_FILE,
    CheckpointStore,
    IncompleteCheckpointError,
    RunIdentity,
    differing_keys,
    flat_config,
    read_run_file,
    write_run_file,
)

CONFIG = {
    "actor": {"lr": 1e-5, "betas": [0.9, 0.99]},
    "trainer": {"total_steps": 10, "resume": "auto"},
    "critic": None,
}
FREE = ("trainer.total_steps", "trainer.resume")


def _write_shard(folder):
    (folder / "actor.bin").write_bytes(b"x" * 100)


def test_the_flat_config_is_sorted_json_values_by_dotted_key():
    assert flat_config(CONFIG) == {
        "actor.betas": "[0.9, 0.99]",
        "actor.lr": "1e-05",
        "critic": "null",
        "trainer.resume": '"auto"',
        "trainer.total_steps": "10",
    }


def test_the_hash_covers_every_key_but_the_free_ones():
    flat = flat_config(CONFIG)
    by_hand = hashlib.sha256(b"actor.betas=[0.9, 0.99]\nactor.lr=1e-05\ncritic=null").hexdigest()[:16]
    assert RunIdentity.of("r", flat, FREE).config_hash == by_hand
    longer = flat_config({**CONFIG, "trainer": {"total_steps": 20, "resume": "disable"}})
    assert RunIdentity.of("r", longer, FREE).config_hash == by_hand
    edited = flat_config({**CONFIG, "actor": {"lr": 1e-4, "betas": [0.9, 0.99]}})
    assert RunIdentity.of("r", edited, FREE).config_hash != by_hand
    assert differing_keys(flat, {**edited, "trainer.total_steps": "20"}, FREE) == ["actor.lr"]
    assert differing_keys(flat, edited) == ["actor.lr"]


def test_a_checkpoint_carries_its_run_and_an_earlier_marker_loads_with_a_warning(tmp_path, caplog):
    identity = RunIdentity.of("run-a", flat_config(CONFIG), FREE)
    store = CheckpointStore(tmp_path / "checkpoints")
    store.save(3, {"loader": {}}, _write_shard, run=identity)
    assert store.latest().run == identity

    # The same checkpoint as format 2 wrote it: no run.
    marker = tmp_path / "checkpoints" / "step_3" / MARKER_FILE
    payload = torch.load(marker, weights_only=True)
    del payload["run"]
    torch.save({**payload, "format": 2}, marker)
    with caplog.at_level(logging.WARNING):
        checkpoint = store.latest()
    assert checkpoint.step == 3 and checkpoint.run is None
    assert f"checkpoint {marker.parent} carries no run id" in caplog.text


def test_a_malformed_run_makes_the_marker_incomplete(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {}, _write_shard, run=RunIdentity("r", "h", {}))
    marker = tmp_path / "step_1" / MARKER_FILE
    payload = torch.load(marker, weights_only=True)
    torch.save({**payload, "run": {"run_id": 5}}, marker)
    with pytest.raises(IncompleteCheckpointError, match="holds a malformed run"):
        store.load(tmp_path / "step_1")


def test_run_json_round_trips_and_a_broken_one_reads_as_none(tmp_path):
    identity = RunIdentity.of("run-b", flat_config(CONFIG), FREE)
    write_run_file(tmp_path, identity, resumed_from=None)
    assert read_run_file(tmp_path) == identity
    (tmp_path / "run.json").write_text("[1, 2")
    assert read_run_file(tmp_path) is None
