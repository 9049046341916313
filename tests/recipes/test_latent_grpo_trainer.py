"""recipes/latent_grpo under `fit`: two Latent-GRPO steps on 2 ranks with the recipe's worker class (HF
engine), from a model briefly taught the latent format. The rollout's log-probs and the training layout's
recomputation agree, the input embedding matrix stays frozen while the rest trains, the recipe's config
says what its README says, and the recipe runs as a script from any folder, as the others do (its worker
class reaches the Ray workers as `recipes.latent_grpo.worker`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
import yaml

from hybridflow.data import read_rows
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.data.synthetic import arithmetic_rows, write_splits
from hybridflow.metrics import read_jsonl
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.models.io import load_causal_lm
from recipes.latent_grpo import main as recipe
from recipes.latent_grpo.sft import SFTConfig, held_out_accuracy, train_supervised
from trainer.config import load_config, recipe_settings
from trainer.fit import fit
from trainer.runtime import Runtime

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "latent_grpo"
CLAIM = re.compile(r"^- `([a-z_]+(?:\.[a-z_]+)+): ([^`]*)`", re.MULTILINE)
REWARD = '''
def count_sevens(data_source, solution_str, ground_truth, extra_info=None):
    """Share of the response's characters that are '7': varies within a group from the first step."""
    return solution_str.count("7") / max(1, len(solution_str))
'''


def _lookup(config: object, key: str) -> object:
    for part in key.split("."):
        config = config[part] if isinstance(config, Mapping) else getattr(config, part)
    return config


def test_readme_claims_match_the_config(tmp_path):
    write_splits(arithmetic_rows(16, 4, digits=2, style="bare", seed=0), tmp_path, ("parquet",))
    config = load_config(
        RECIPE / "config.yaml",
        [f"data.train_files=[{tmp_path / 'train.parquet'}]", f"data.val_files=[{tmp_path / 'test.parquet'}]"],
    )
    settings = recipe_settings(config, recipe.LatentGRPOSettings)
    assert settings.variant == "latent" and settings.top_k == 2
    claims = CLAIM.findall((RECIPE / "README.md").read_text())
    assert len(claims) >= 5
    for key, value in claims:
        assert _lookup(config, key) == yaml.safe_load(value), key


@pytest.fixture(scope="module")
def latent_model(tmp_path_factory) -> tuple[Path, Path]:
    """(data folder, a tiny model after 80 supervised steps in the latent format)."""
    root = tmp_path_factory.mktemp("latent-grpo")
    write_splits(arithmetic_rows(256, 32, digits=2, style="bare", seed=0), root, ("parquet",))
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(len(tokenizer), max_position_embeddings=64, seed=0)
    train_supervised(model, tokenizer, read_rows(root / "train.parquet"), "latent", SFTConfig(steps=80, lr=3e-3))
    # It has learned the format (end of thinking, then an answer), not yet the sums.
    _, length = held_out_accuracy(model, tokenizer, read_rows(root / "test.parquet"), "latent", 12)
    assert 4 <= length <= 8, length
    (root / "reward.py").write_text(REWARD)
    return root, save_model_dir(model, tokenizer, root / "model")


def _small_run(root: Path, model_dir: Path) -> list[str]:
    """Overrides of the recipe's config for a CPU-sized run on the test's model and task, without
    validation, logging to jsonl only."""
    return [
        f"model.path={model_dir}",
        f"data.train_files=[{root / 'train.parquet'}]",
        f"data.val_files=[{root / 'test.parquet'}]",
        "data.train_batch_size=8",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=32",
        "actor.ppo_micro_batch_size=8",
        f"reward.default_fn={root / 'reward.py'}:count_sevens",
        "trainer.val_every=0",
        "trainer.val_before_train=false",
        "trainer.loggers=[jsonl]",
    ]


@pytest.mark.slow
def test_two_latent_grpo_steps_keep_rollout_and_trainer_in_sync(ray_cluster, latent_model):
    root, model_dir = latent_model
    config = load_config(
        RECIPE / "config.yaml",
        [
            *_small_run(root, model_dir),
            "actor.lr=3e-3",
            "trainer.total_steps=2",
            f"trainer.output_dir={root / 'run'}",
            "resharding.max_log_prob_gap=1e-3",
            "resource.cpus_per_slot=0.5",
        ],
    )
    settings = recipe_settings(config, recipe.LatentGRPOSettings)
    with Runtime(config, worker_classes={"actor_rollout": recipe.LatentActor}) as runtime:
        runtime.actor.set_latent_sampling(recipe.latent_sampling(runtime, settings))
        before = runtime.actor.gather_full_state()[0]
        fit(runtime, recipe.latent_grpo_step)
        after = runtime.actor.gather_full_state()[0]
    initial = load_causal_lm(model_dir).state_dict()
    assert torch.equal(before["model.embed_tokens.weight"], initial["model.embed_tokens.weight"])
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])
    assert not torch.equal(after["lm_head.weight"], before["lm_head.weight"])
    records = read_jsonl(root / "run" / "metrics.jsonl")
    assert len(records) == 2
    for record in records:
        # Latent positions included: the engine's Gumbel log-densities are the trainer's.
        assert record["sync/log_prob_abs_diff_max"] < 1e-4, record
        assert record["latent/latent_steps_mean"] > 0.5
        assert record["latent/reasoning_length_mean"] == pytest.approx(
            record["latent/latent_steps_mean"] + record["latent/explicit_tokens_mean"]
        )
        assert record["actor/grad_norm"] > 0


@pytest.mark.slow
def test_the_recipe_runs_one_step_as_a_script_from_another_folder(latent_model, tmp_path):
    """``python recipes/latent_grpo/main.py``, as every recipe runs, from a folder outside the repository:
    no ``-m`` and no path of its own, so the Ray workers import the worker class from the installed
    ``recipes`` package. One step, from the briefly taught model (no supervised stage)."""
    root, model_dir = latent_model
    out = tmp_path / "run"
    command = [
        sys.executable,
        str(RECIPE / "main.py"),
        *_small_run(root, model_dir),
        "trainer.total_steps=1",
        f"trainer.output_dir={out}",
        f"rollout.cache_dir={tmp_path / 'compile'}",
        "resource.cpus_per_slot=0.5",
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    # The recipe's worker ran the rollout (latent steps) and its training forward (the engine's Gumbel
    # log-densities are the trainer's); the plain actor would have no latent steps.
    assert records[0]["latent/latent_steps_mean"] > 0.5
    assert records[0]["sync/log_prob_abs_diff_max"] < 1e-4
    assert records[0]["actor/grad_norm"] > 0
