"""The trainer's start-up report on a real run (one rank: the parts are the driver's timings, whatever
the number of ranks): its parts, in order, add up to the wall time from the trainer's construction to
the first step, and it is logged once."""

from __future__ import annotations

import time

import pytest

from hybridflow.metrics import read_jsonl
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.runtime import Runtime

PARTS = [
    "before", "data", "reward", "placement", "processes", "model", "engine", "loggers", "resume", "validation"
]


def test_the_startup_report_splits_the_time_before_the_first_step(ray_cluster, tmp_path):
    config = run_config(
        write_task(tmp_path),
        "hf",
        steps=2,
        extra=["trainer.val_before_train=true", "trainer.val_every=0", "resource.slots_per_node=1"],
    )
    first_step_at: list[float] = []

    def timed_step(runtime, prompts):
        first_step_at.append(time.perf_counter())
        return rl_step(runtime, prompts)

    started = time.perf_counter()
    with Runtime(config, startup_s={"before": 1.5}) as runtime:
        fit(runtime, timed_step)
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    report = {key: value for key, value in records[0].items() if key.startswith("startup/")}
    assert list(report) == [*(f"startup/{part}_s" for part in PARTS), "startup/total_s"]
    assert all(value >= 0 for value in report.values())
    assert report["startup/before_s"] == 1.5
    assert report["startup/total_s"] == pytest.approx(sum(v for k, v in report.items() if k != "startup/total_s"))
    # The parts cover the trainer's start-up end to end: all but the 1.5 s handed in was measured here.
    assert report["startup/total_s"] - 1.5 == pytest.approx(first_step_at[0] - started, abs=0.5)
    # Loading the model on the workers is a share of the load call, so it is at most the call.
    assert 0 < report["startup/model_s"] < report["startup/model_s"] + report["startup/engine_s"]
    assert "val/accuracy" in records[0]
    assert not any(key.startswith("startup/") for record in records[1:] for key in record)
