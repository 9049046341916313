"""Loggers: console line and bar, jsonl file, tensorboard events, wandb offline, fan-out, missing packages."""

from __future__ import annotations

import io
import json
import math
import sys
import time
from pathlib import Path

import pytest
import torch

from hybridflow.metrics import (
    ConsoleLogger,
    JsonlLogger,
    LoggerUnavailableError,
    MetricLogger,
    MultiLogger,
    TensorBoardLogger,
    create_logger,
    read_jsonl,
)


class Recorder(MetricLogger):
    def __init__(self) -> None:
        self.calls: list[tuple[dict, int]] = []
        self.closed = False

    def log(self, metrics, step):
        self.calls.append((dict(metrics), step))

    def close(self):
        self.closed = True


def test_jsonl_writes_one_readable_object_per_step(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        logger.log({"score/mean": torch.tensor(0.5), "timing_s/step": 2}, step=1)
        logger.log({"score/mean": 0.75, "actor/kl": math.nan}, step=2)
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "score/mean": 0.5, "timing_s/step": 2.0},
        {"step": 2, "score/mean": 0.75, "actor/kl": None},
    ]


def test_jsonl_appends_and_a_resumed_step_replaces_the_old_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        for step in (1, 2, 3):
            logger.log({"loss": float(step)}, step)
    with JsonlLogger(path) as logger:  # resumed from the step-2 checkpoint
        logger.log({"loss": 30.0}, 3)
    assert [(r["step"], r["loss"]) for r in read_jsonl(path)] == [(1, 1.0), (2, 2.0), (3, 30.0)]


def test_console_line_shows_the_headline_keys_in_order():
    stream = io.StringIO()
    logger = ConsoleLogger(total_steps=10, keys=("score/mean", "missing", "timing_s/step"), stream=stream)
    logger.log({"timing_s/step": 1.23456, "score/mean": 0.5, "other": 1.0}, step=3)
    logger.close()
    text = stream.getvalue()
    assert "step 3/10 | score/mean 0.5 | timing_s/step 1.235\n" in text
    assert "training:  30%" in text  # the bar moved to step 3 of 10
    assert "other" not in text


def test_console_without_bar_prints_plain_lines():
    stream = io.StringIO()
    logger = ConsoleLogger(keys=("a",), stream=stream, progress=False)
    logger.log({"a": 2}, step=7)
    assert stream.getvalue() == "step 7 | a 2\n"


def test_multi_logger_fans_out_and_closes_all():
    first, second = Recorder(), Recorder()
    multi = MultiLogger([first, second])
    multi.log({"x": 1.0}, 4)
    multi.close()
    assert first.calls == second.calls == [({"x": 1.0}, 4)]
    assert first.closed and second.closed


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with TensorBoardLogger(tmp_path / "tb") as logger:
        logger.log({"score/mean": 0.25}, step=1)
        logger.log({"score/mean": 0.5}, step=2)
    events = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(events) == 1
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert [(e.step, e.value) for e in accumulator.Scalars("score/mean")] == [(1, 0.25), (2, 0.5)]


@pytest.mark.parametrize(
    ("name", "modules", "package"),
    [
        ("tensorboard", ["torch.utils.tensorboard", "tensorboard"], "tensorboard"),
        ("wandb", ["wandb"], "wandb"),
    ],
)
def test_missing_logger_package_is_named(tmp_path, monkeypatch, name, modules, package):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(LoggerUnavailableError, match=f"needs the {package} package: pip install {package}"):
        create_logger([name], output_dir=tmp_path)


def test_create_logger_builds_the_named_loggers_under_the_output_dir(tmp_path):
    with create_logger(["jsonl"], output_dir=tmp_path / "out") as logger:
        logger.log({"a": 1.0}, 1)
    assert read_jsonl(tmp_path / "out" / "metrics.jsonl") == [{"step": 1, "a": 1.0}]
    with pytest.raises(ValueError, match="unknown logger"):
        create_logger(["jsonl", "tb"], output_dir=tmp_path)


@pytest.mark.slow
def test_wandb_offline_run_is_written_under_the_output_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    for variable in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    with create_logger(
        ["wandb"], output_dir=tmp_path / "run", experiment="unit", config={"lr": 1e-5}
    ) as logger:
        logger.log({"unit_test_metric/mean": 0.125}, 1)
    (run_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's service process may still be flushing the run file when finish() returns (seen on a
    # loaded host): wait for the record rather than read once.
    deadline = time.monotonic() + 60
    while b"unit_test_metric/mean" not in Path(run_file).read_bytes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert b"unit_test_metric/mean" in Path(run_file).read_bytes()
