"""No silent defaults: a policy loss run from a config keeps its own clip unless the config sets one, and
estimators whose inputs no step makes are refused with the reason named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hybridflow.data import write_rows
from hybridflow.protocol import Batch
from trainer.config import ConfigError, load_config
from workers.objective import PolicyObjective

TOKENS = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Overrides naming a one-row training file (a config needs one)."""
    train = Path(tmp_path_factory.mktemp("data")) / "train.jsonl"
    write_rows([{"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}], train)
    return [f"data.train_files=[{train}]", "trainer.val_before_train=false"]


def loss_value(overrides: list[str], log_prob: float, old_log_prob: float) -> float:
    """The policy loss of one row of ``TOKENS`` tokens, advantage +1 at each, with every token's
    current and old log-prob as given, under the objective that the config builds."""
    actor = load_config(None, overrides).actor
    objective = PolicyObjective(actor.policy_loss, actor.policy_loss_params(), loss_agg_mode="token-mean")
    mask = torch.ones(1, TOKENS)
    batch = Batch(
        {"response_mask": mask, "old_log_probs": torch.full((1, TOKENS), old_log_prob), "advantages": mask.clone()}
    )
    loss, _ = objective(torch.full((1, TOKENS), log_prob), None, batch, float(TOKENS), 1.0)
    return loss.item()


# (loss, current log-prob, old log-prob, hand-computed loss with the paper's clip, a clip to set, its loss)
# Advantage +1 and a ratio above every upper bound, so the upper clip decides the value.
CASES = [
    # PPO (arXiv:1707.06347), eps 0.2: r = e^0.3 is cut to 1.2, the loss is -1.2.
    ("ppo_clip", -1.0, -1.3, -1.2, "actor.clip_eps_high=0.1", -1.1),
    # clip_cov (arXiv:2505.22617) keeps PPO's value with eps 0.2.
    ("clip_cov", -1.0, -1.3, -1.2, "actor.clip_eps_high=0.1", -1.1),
    # GSPO (arXiv:2507.18071), 3e-4 / 4e-4: s = e^0.01 is cut to 1 + 4e-4.
    ("gspo", -1.0, -1.01, -(1 + 4e-4), "actor.clip_eps_high=0.2", -math.exp(0.01)),
    # GMPO (arXiv:2507.20673), 0.4 in log space: d = 0.5 is cut to 0.4, the loss is -e^0.4.
    ("gmpo", -1.0, -1.5, -math.exp(0.4), "actor.clip_eps_low=0.2", -math.exp(0.2)),
    # CISPO's weight cap 3 (ScaleRL, arXiv:2510.13786): w = e^1.5 is cut to 4, loss -A * 4 * log pi = 4.
    ("cispo", -1.0, -2.5, 4.0, "actor.clip_eps_high=1.0", 2.0),
]


@pytest.mark.parametrize(("loss", "log_prob", "old", "paper", "override", "overridden"), CASES)
def test_each_loss_runs_with_its_own_clip_unless_the_config_sets_one(
    data: list[str], loss: str, log_prob: float, old: float, paper: float, override: str, overridden: float
) -> None:
    chosen = [*data, f"actor.policy_loss={loss}"]
    assert loss_value(chosen, log_prob, old) == pytest.approx(paper, rel=1e-5)
    assert loss_value([*chosen, override], log_prob, old) == pytest.approx(overridden, rel=1e-5)


def test_the_clip_keys_default_to_null_and_pass_nothing(data: list[str]) -> None:
    actor = load_config(None, [*data, "actor.policy_loss=gspo"]).actor
    assert (actor.clip_eps_low, actor.clip_eps_high, actor.dual_clip_c) == (None, None, None)
    assert actor.policy_loss_params() == {}


def test_a_clip_key_that_the_loss_does_not_take_is_refused(data: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"actor\.clip_eps_low: policy loss 'reinforce' takes no clip_eps_low"):
        load_config(None, [*data, "actor.policy_loss=reinforce", "actor.clip_eps_low=0.2"])
    with pytest.raises(ConfigError, match=r"actor\.dual_clip_c: policy loss 'gspo' takes no dual_clip_c"):
        load_config(None, [*data, "actor.policy_loss=gspo", "actor.dual_clip_c=3.0"])


def test_remax_is_refused_until_a_step_makes_its_greedy_baseline(data: list[str]) -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.adv_estimator: 'remax' needs .*baseline_scores") as error:
        load_config(None, [*data, "algorithm.adv_estimator=remax"])
    assert "no step generates that greedy baseline" in str(error.value)


@pytest.mark.parametrize("estimator", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_with_an_estimator_kl_coef_is_refused(data: list[str], estimator: str) -> None:
    with pytest.raises(ConfigError, match=r"algorithm\.estimator_kwargs\.kl_coef: .*no step makes one"):
        load_config(None, [*data, f"algorithm.adv_estimator={estimator}", "algorithm.estimator_kwargs={kl_coef: 0.1}"])
    # Without the coefficient (the KL in the reward instead) the estimator loads.
    load_config(None, [*data, f"algorithm.adv_estimator={estimator}", "algorithm.use_kl_in_reward=true"])


def test_forced_zero_advantage_skipping_that_would_change_the_update_is_refused_on_load(data: list[str]) -> None:
    forced = [*data, "actor.skip_zero_advantage_rows=true", "actor.use_kl_loss=true", "actor.entropy_coef=0.01"]
    with pytest.raises(ConfigError, match=r"actor\.skip_zero_advantage_rows: true would change the update: .*KL loss"):
        load_config(None, forced)
    assert load_config(None, [*data, "actor.use_kl_loss=true"]).actor.skip_zero_advantage_rows == "auto"
