"""The demo's script: its config is the measured set-up (docs/benchmarks.md), ``--seed`` reaches every
seed, and its accuracy table reads steps, training time and wall time off the metrics. No Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.data.synthetic import arithmetic_rows, write_splits
from recipes.arithmetic_demo import main as demo
from trainer.config import derive_sizes


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("demo-data")
    write_splits(arithmetic_rows(64, 16, digits=2, style="bare", seed=0), root, ("parquet",))
    return root


def test_config_is_the_measured_set_up(data, tmp_path):
    config = demo.demo_config(data, 1, ["trainer.total_steps=3"], tmp_path)
    tiny = config.model.tiny
    shape = (tiny.hidden_size, tiny.num_layers, tiny.num_heads, tiny.num_kv_heads, tiny.intermediate_size)
    assert shape == (256, 4, 4, 2, 768)
    assert config.model.path == str(tmp_path)
    assert (tiny.seed, config.data.seed, config.rollout.seed) == (1, 1, 1)
    assert config.trainer.total_steps == 3  # overrides win
    assert derive_sizes(config).rows_per_step == 64 * 8
    assert (config.rollout.temperature, config.actor.lr, config.actor.lr_scheduler) == (1.0, 1e-4, "cosine")
    assert config.actor.min_lr_ratio == 0.1
    assert (config.actor.clip_eps_low, config.actor.clip_eps_high, config.actor.use_kl_loss) == (0.2, 0.2, False)
    assert config.actor.ppo_mini_batch_size == 512  # one optimizer step per batch
    assert (config.rollout.engine, config.actor.ppo_micro_batch_size) == ("hf", 256)
    assert (config.resource.slots_per_node, config.resource.cpus_per_slot) == (1, 2.0)  # one rank
    assert config.reward.default_fn == "exact_match"
    assert config.trainer.val_before_train and config.trainer.val_every == 10
    assert demo.demo_config(data, 0, []).trainer.total_steps == 250
    assert demo.WARM_START.steps == 290


def test_accuracy_table_reads_steps_training_and_wall_time():
    records = [
        {"step": 0, "val/accuracy": 0.274},
        {"step": 1, "timing_s/step": 2.0, "time/since_start_s": 130.0},
        {"step": 2, "timing_s/step": 3.0, "time/since_start_s": 134.0, "val/accuracy": 0.5},
    ]
    assert demo.accuracy_table(records, fit_started=127.0) == [
        " step  training s   wall s  held-out accuracy",
        "    0           0      127  27.4%",
        "    2           5      134  50.0%",
    ]
