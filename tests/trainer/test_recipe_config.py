"""Config surface for recipes: extra keyword arguments of losses and estimators, and the `recipe` section."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from hybridflow.data import write_rows
from trainer.config import ConfigError, load_config, recipe_field, recipe_settings


@pytest.fixture
def data(tmp_path: Path) -> list[str]:
    train = tmp_path / "train.parquet"
    write_rows([{"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}], train)
    return [f"data.train_files=[{train}]", "trainer.val_before_train=false"]


def test_policy_loss_kwargs_reach_the_loss_and_override_the_clip_keys(data):
    config = load_config(
        None, [*data, "actor.policy_loss=sapo", "actor.policy_loss_kwargs={tau_neg: 2.0, tau_pos: 0.5}"]
    )
    assert config.actor.policy_loss_params() == {"tau_neg": 2.0, "tau_pos": 0.5}
    clipped = load_config(None, [*data, "actor.clip_eps_high=0.28", "actor.policy_loss_kwargs={clip_eps_high: 0.3}"])
    assert clipped.actor.policy_loss_params()["clip_eps_high"] == 0.3


def test_an_argument_the_loss_or_estimator_does_not_take_names_its_key(data):
    with pytest.raises(ConfigError) as info:
        load_config(None, [*data, "actor.policy_loss=sapo", "actor.policy_loss_kwargs={tau_ng: 2.0}",
                           "algorithm.adv_estimator=pass_at_k", "algorithm.estimator_kwargs={kk: 2}"])
    problems = info.value.problems
    assert any(p.startswith("actor.policy_loss_kwargs.tau_ng: sapo takes no argument 'tau_ng' (did you mean 'tau_neg'?)")
               for p in problems), problems
    assert any(p.startswith("algorithm.estimator_kwargs.kk: pass_at_k takes no argument 'kk'") for p in problems), problems


def test_estimator_kwargs_are_passed_to_the_estimator(data):
    config = load_config(None, [*data, "algorithm.adv_estimator=pass_at_k", "algorithm.estimator_kwargs={k: 4}"])
    assert config.algorithm.advantage_params()["k"] == 4


@dataclass(frozen=True)
class Settings:
    max_rounds: int = recipe_field(4, ge=1)
    filter_truncated: bool = True


def test_recipe_settings_default_convert_and_name_bad_keys(data):
    assert recipe_settings(load_config(None, data), Settings) == Settings()
    assert recipe_settings(load_config(None, [*data, "recipe.max_rounds=2"]), Settings).max_rounds == 2
    with pytest.raises(ConfigError) as info:
        recipe_settings(load_config(None, [*data, "recipe.max_round=2", "recipe.filter_truncated=maybe",
                                           "recipe.max_rounds=0"]), Settings)
    problems = info.value.problems
    assert "recipe.max_round: unknown key; did you mean 'recipe.max_rounds'?" in problems
    assert any(p.startswith("recipe.filter_truncated: expected true or false") for p in problems), problems
    assert any(p.startswith("recipe.max_rounds: must be >= 1") for p in problems), problems
