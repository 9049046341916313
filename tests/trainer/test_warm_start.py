"""The supervised warm-start: a fixed number of steps from a seed gives the same weights on every run,
it trains on the answer tokens, and `warm_started_model` trains once per set-up and then reuses the
checkpoint. Single process, tiny models, a few seconds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.data import read_rows
from hybridflow.data.synthetic import arithmetic_rows, write_splits
from hybridflow.models.io import load_causal_lm
from tests.trainer._runs import write_task
from trainer.config import RunConfig, load_config
from trainer.model_setup import load_tokenizer, prepare_model_dir
from trainer.warm_start import (
    RECORD_FILE,
    WarmStartConfig,
    cache_miss_reason,
    greedy_accuracy,
    warm_start,
    warm_start_cache_key,
    warm_start_folder,
    warm_started_model,
)

TINY = [
    "model.tiny.hidden_size=32",
    "model.tiny.num_layers=1",
    "model.tiny.num_heads=1",
    "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64",
    "model.tiny.max_position_embeddings=32",
    "data.max_prompt_length=8",
    "data.max_response_length=8",
]
FEW = WarmStartConfig(steps=4, batch_size=8, seed=0)


def tiny_config(root: Path, *extra: str) -> RunConfig:
    return load_config(
        None,
        [
            f"data.train_files=[{root / 'train.parquet'}]",
            f"data.val_files=[{root / 'test.parquet'}]",
            *TINY,
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def arithmetic(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arith")
    write_splits(arithmetic_rows(200, 20, digits=2, style="bare", seed=0), root, ("parquet",))
    return root


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_causal_lm(path).state_dict()


def test_same_seed_same_weights_other_seed_other_weights(arithmetic, tmp_path):
    config = tiny_config(arithmetic)
    first, _ = warm_started_model(config, tmp_path / "a", FEW)
    again, _ = warm_started_model(config, tmp_path / "b", FEW)
    other, _ = warm_started_model(config, tmp_path / "c", WarmStartConfig(steps=4, batch_size=8, seed=1))
    initial = weights(prepare_model_dir(config, tmp_path / "initial"))
    a, b, c = weights(first), weights(again), weights(other)
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert not all(torch.equal(a[name], c[name]) for name in a)
    assert not all(torch.equal(a[name], initial[name]) for name in a)


def test_the_cache_trains_once_per_set_up(arithmetic, tmp_path, caplog):
    config = tiny_config(arithmetic)
    with caplog.at_level(logging.WARNING, logger="trainer.warm_start"):
        path, accuracy = warm_started_model(config, tmp_path, FEW)
    assert f"no finished warm start in {tmp_path}" in caplog.text
    assert path == warm_start_folder(tmp_path, warm_start_cache_key(config, FEW))
    written = (path / "model.safetensors").stat().st_mtime_ns
    # The reported accuracy is the saved model's greedy accuracy on the held-out split.
    held_out = read_rows(arithmetic / "test.parquet")
    assert accuracy == greedy_accuracy(load_causal_lm(path), load_tokenizer(config, path), held_out)
    assert warm_started_model(config, tmp_path, FEW) == (path, accuracy)
    assert (path / "model.safetensors").stat().st_mtime_ns == written
    # Measuring more often changes nothing that is trained, so it is the same checkpoint.
    assert warm_started_model(config, tmp_path, WarmStartConfig(steps=4, batch_size=8, eval_every=2))[0] == path
    # Any setting that changes the weights is a different checkpoint, and the miss names what differs.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer.warm_start"):
        longer, _ = warm_started_model(config, tmp_path, WarmStartConfig(steps=5, batch_size=8))
    assert "the closest of 1 cached warm starts" in caplog.text and "differs in warm_start\n" in caplog.text + "\n"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainer.warm_start"):
        reseeded, _ = warm_started_model(tiny_config(arithmetic, "model.tiny.seed=3"), tmp_path, FEW)
    assert "the closest of 2 cached warm starts" in caplog.text and "differs in tiny\n" in caplog.text + "\n"
    assert len({path, longer, reseeded}) == 3
    # A folder without its record is an interrupted run of the same key.
    (path / RECORD_FILE).unlink()
    assert cache_miss_reason(tmp_path, warm_start_cache_key(config, FEW)) == f"{path} was not finished (no {RECORD_FILE})"


def answer_is_seven(tmp_path: Path) -> tuple[Path, Any, list[dict], list[dict]]:
    """A fresh tiny model, its tokenizer, and 48 training and 16 held-out rows whose answer is always "7"."""
    root = write_task(tmp_path, prompts=64)
    rows = read_rows(root / "train.parquet")
    config = load_config(None, [f"data.train_files=[{root / 'train.parquet'}]", *TINY])
    initial = prepare_model_dir(config, tmp_path / "cache")
    return initial, load_tokenizer(config, initial), rows[:48], rows[48:]


def test_it_learns_the_answer_and_reports_the_curve(tmp_path):
    # Every answer is "7": a few steps at a high learning rate teach a fresh model to answer it (and
    # stop), so greedy accuracy goes from 0 to 1 on prompts it never saw.
    initial, tokenizer, train, held_out = answer_is_seven(tmp_path)
    assert greedy_accuracy(load_causal_lm(initial), tokenizer, held_out) == 0.0
    settings = WarmStartConfig(steps=30, batch_size=16, lr=1e-2, seed=0, eval_every=10)
    result = warm_start(initial, tokenizer, train, held_out, tmp_path / "out", settings)
    assert [step for step, _ in result.curve] == [10, 20, 30]
    assert result.steps == 30 and result.accuracy == result.curve[-1][1] == 1.0
    assert greedy_accuracy(load_causal_lm(tmp_path / "out"), tokenizer, held_out) == 1.0


def test_below_min_accuracy_it_extends_in_blocks_until_reached_or_max_steps(tmp_path, caplog):
    # The "answer is 7" task again: from 1 step, blocks of 4 until every held-out answer is right.
    initial, tokenizer, train, held_out = answer_is_seven(tmp_path)
    common = {"batch_size": 16, "lr": 3e-4, "seed": 0, "extend_every": 4}
    extended = warm_start(
        initial, tokenizer, train, held_out, tmp_path / "ext", WarmStartConfig(steps=1, min_accuracy=1.0, max_steps=60, **common)
    )
    measured_at = [step for step, _ in extended.curve]
    assert measured_at == list(range(1, extended.steps + 1, 4)) and extended.steps > 1
    assert extended.accuracy == 1.0 and all(accuracy < 1.0 for _, accuracy in extended.curve[:-1])
    # The stop is a step count: the same weights as a plain run of that many steps.
    plain = warm_start(initial, tokenizer, train, held_out, tmp_path / "plain", WarmStartConfig(steps=extended.steps, **common))
    first, second = weights(tmp_path / "ext"), weights(tmp_path / "plain")
    assert plain.accuracy == 1.0 and all(torch.equal(first[name], second[name]) for name in first)
    # max_steps caps the extension, with a warning naming it.
    with caplog.at_level(logging.WARNING, logger="trainer.warm_start"):
        capped = warm_start(
            initial, tokenizer, train, held_out, tmp_path / "cap", WarmStartConfig(steps=1, min_accuracy=1.0, max_steps=3, **common)
        )
    assert capped.steps == 3 and [step for step, _ in capped.curve] == [1, 3]
    assert "stopped at max_steps=3" in caplog.text


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"WarmStartConfig.steps must be >= 1, got 0"):
        WarmStartConfig(steps=0)
    with pytest.raises(ValueError, match=r"WarmStartConfig.lr must be > 0"):
        WarmStartConfig(lr=0.0)
    with pytest.raises(ValueError, match=r"WarmStartConfig.max_steps \(5\) must be >= steps \(6\)"):
        WarmStartConfig(steps=6, max_steps=5)
    with pytest.raises(ValueError, match=r"WarmStartConfig.min_accuracy must lie in \[0, 1\]"):
        WarmStartConfig(min_accuracy=1.5)


def test_refuses_a_configured_model_path(arithmetic, tmp_path):
    config = tiny_config(arithmetic, f"model.path={tmp_path}")
    with pytest.raises(ValueError, match=r"model\.path is set"):
        warm_started_model(config, tmp_path, FEW)
