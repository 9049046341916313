"""A run resumed in the same output folder logs each step once: `rewind` on the file loggers."""

from __future__ import annotations

import json
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hybridflow.metrics import JsonlLogger, TensorBoardLogger, create_logger


def steps_and_losses(path: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, path.read_text().splitlines())]


def test_jsonl_rewind_drops_the_steps_the_resumed_run_logs_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlLogger(path) as logger:  # killed during step 6, after logging step 5
        for step in range(1, 6):
            logger.log({"loss": float(step)}, step)
    with path.open("a") as file:  # the record of step 6, cut short by the kill
        file.write('{"step": 6, "lo')
    with JsonlLogger(path) as logger:  # resumed from the step-4 checkpoint
        logger.rewind(5)
        for step in (5, 6):
            logger.log({"loss": 10.0 * step}, step)
    assert steps_and_losses(path) == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 50.0), (6, 60.0)]


def test_a_fresh_start_in_the_same_folder_keeps_no_old_record(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        logger.log({"loss": 1.0}, 0)
        logger.log({"loss": 2.0}, 1)
    with JsonlLogger(path) as logger:
        logger.rewind(0)
        logger.log({"loss": 3.0}, 0)
    assert steps_and_losses(path) == [(0, 3.0)]


def scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_tensorboard_rewind_shows_each_step_once(tmp_path):
    with TensorBoardLogger(tmp_path) as logger:
        for step in range(1, 6):
            logger.log({"loss": float(step)}, step)
    with TensorBoardLogger(tmp_path) as logger:
        logger.rewind(4)
        for step in (4, 5):
            logger.log({"loss": 10.0 * step}, step)
    assert scalars(tmp_path, "loss") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0)]


def test_create_logger_rewinds_every_file_logger(tmp_path):
    names = ["console", "jsonl", "tensorboard"]
    with create_logger(names, output_dir=tmp_path, total_steps=3) as logger:
        for step in (1, 2, 3):
            logger.log({"loss": float(step)}, step)
    with create_logger(names, output_dir=tmp_path, total_steps=3) as logger:
        logger.rewind(3)
        logger.log({"loss": 30.0}, 3)
    assert steps_and_losses(tmp_path / "metrics.jsonl") == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert scalars(tmp_path / "tensorboard", "loss") == [(1, 1.0), (2, 2.0), (3, 30.0)]
