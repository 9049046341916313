"""Resuming with an edited learning rate, end to end: the logged ``actor/lr`` is the config's.

The probe: a run trained at ``actor.lr=1e-5`` and checkpointed; resumed with the config saying 1e-4,
it logged the old 1e-5 (the optimizer state won, silently). Now the resumed step logs 1e-4 (a constant
schedule: the lr is the config's value itself), the run says which setting won, and the resumed run
keeps the checkpoint's run id.
"""

from __future__ import annotations

import json
import logging

import pytest

from hybridflow.checkpoint import CheckpointStore
from hybridflow.metrics import read_jsonl
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.runtime import Runtime

# One rank and one step before the checkpoint: what is checked is which setting wins on resume, which
# neither the rank count nor the number of steps before the save changes.
ONE_RANK = "resource.slots_per_node=1"


def test_an_edited_lr_wins_on_resume_and_is_logged(ray_cluster, tmp_path, caplog):
    root = write_task(tmp_path)
    with Runtime(run_config(root, "hf", 1, [ONE_RANK, "trainer.save_every=1", "actor.lr=1e-5"])) as runtime:
        fit(runtime, rl_step)
    first_run = json.loads((root / "run" / "run.json").read_text())["run_id"]

    resumed = run_config(root, "hf", 2, [ONE_RANK, "actor.lr=1e-4"])
    with caplog.at_level(logging.WARNING), Runtime(resumed) as runtime:
        fit(runtime, rl_step)
    records = read_jsonl(root / "run" / "metrics.jsonl")
    assert [record["step"] for record in records] == [1, 2]
    assert [record["actor/lr"] for record in records] == pytest.approx([1e-5, 1e-4], rel=1e-9)
    assert "the optimizer settings differ from the checkpoint's: actor.lr 1e-05 -> 0.0001" in caplog.text
    assert "The config wins" in caplog.text
    assert json.loads((root / "run" / "run.json").read_text())["run_id"] == first_run
    assert CheckpointStore(root / "run" / "checkpoints").latest().run.run_id == first_run
