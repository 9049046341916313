"""The trainer at its fault edges, end to end on the tiny task (real Ray, FSDP2, the HF engine, one rank):

- a resumed run falls back past a torn newest checkpoint, naming it, and logs each step once;
- a checkpoint onto a full disk (a small tmpfs) fails as "no space left", though the distributed
  checkpoint is written by the worker processes, and leaves no partial checkpoint.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from hybridflow.checkpoint import MARKER_FILE, CheckpointStore, DiskFullError
from hybridflow.metrics import read_jsonl
from tests.checkpoint._small_disk import small_disk
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.runtime import Runtime

# One rank: the checkpoint is still written by a worker process, and what is checked (which checkpoint a
# resume takes, what a full disk reports) does not depend on the number of ranks.
ONE_RANK = "resource.slots_per_node=1"


def logged_steps(path: Path) -> list[int]:
    """The step of every line of a metrics file, in file order (repeats included)."""
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_resume_skips_a_torn_checkpoint_and_logs_each_step_once(ray_cluster, tmp_path, caplog):
    root = write_task(tmp_path)
    settings = [ONE_RANK, "trainer.save_every=1", "trainer.loggers=[jsonl,tensorboard]"]
    with Runtime(run_config(root, "hf", 2, settings)) as runtime:
        fit(runtime, rl_step)
    metrics = root / "run" / "metrics.jsonl"
    first = {record["step"]: record for record in read_jsonl(metrics)}
    assert logged_steps(metrics) == [1, 2]
    # The run is killed while writing the step-2 marker: half of it is on the disk.
    marker = root / "run" / "checkpoints" / "step_2" / MARKER_FILE
    marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])

    with caplog.at_level(logging.WARNING), Runtime(run_config(root, "hf", 2, settings)) as runtime:
        fit(runtime, rl_step)
    assert re.search(r"skipping checkpoint \S+step_2 is incomplete: trainer_state\.pt cannot be read", caplog.text)
    assert re.search(r"resumed from \S+step_1 at step 1", caplog.text)
    second = {record["step"]: record for record in read_jsonl(metrics)}
    assert logged_steps(metrics) == [1, 2]
    # Step 1 is the first run's record; step 2 was run again from the step-1 checkpoint.
    assert second[1] == first[1]
    assert second[2]["timing_s/step"] != first[2]["timing_s/step"]
    for key in ("score/mean", "actor/pg_loss", "actor/grad_norm"):
        assert second[2][key] == pytest.approx(first[2][key], rel=1e-5, abs=1e-7), key
    # The rewritten step-2 checkpoint is complete again.
    assert CheckpointStore(root / "run" / "checkpoints").latest().step == 2


def test_a_checkpoint_onto_a_full_disk_says_so_and_leaves_nothing(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    with small_disk(tmp_path / "disk", 256 << 10) as disk:
        config = run_config(root, "hf", 1, [ONE_RANK, "trainer.save_every=1", f"trainer.checkpoint_dir={disk}"])
        with Runtime(config) as runtime, pytest.raises(DiskFullError) as info:
            fit(runtime, rl_step)
        message = str(info.value)
        match = re.fullmatch(
            rf"no space left on {disk} while saving checkpoint step 1 \(needed ~([\d.]+) MB, free ([\d.]+) MB\); "
            r"the partial checkpoint step_1 was removed",
            message,
        )
        assert match, message
        # The estimate (three copies of the model's weights) exceeds the whole 0.25 MB disk, all free again.
        assert float(match[1]) > 0.25 and 0.2 <= float(match[2]) <= 0.25
        assert list(disk.iterdir()) == []
