"""Episodes cut by the turn or the token limit end cleanly: their ledger ends on a policy id, their
mask and reward are those of the turns they had, and they are counted."""

from __future__ import annotations

import functools

import pytest

from hybridflow.agents import (
    AgentConfig,
    TextCodec,
    episode_metrics,
    episodes_to_batch,
    make_environment,
    run_episodes,
)
from hybridflow.rollout import HFRolloutEngine, SamplingParams
from tests.agents._scripted import CountingEnvironment
from tests.rollout import _tiny

PROMPTS = ("12+7=", "3*(4-1)=", "a", "ab+cd*9=")


def _rollout(config: AgentConfig, turns: int, max_new: int = 6):
    tokenizer = _tiny.tokenizer()
    engine = HFRolloutEngine(_tiny.model(), [tokenizer.eos_token_id], tokenizer.pad_token_id, seed=11)
    return run_episodes(
        engine,
        [{"prompt": p} for p in PROMPTS],
        functools.partial(make_environment, "test_counting", turns=turns),
        TextCodec(tokenizer),
        SamplingParams(temperature=1.0, max_new_tokens=max_new),
        config,
    )


def test_turn_limit_cuts_after_the_last_allowed_turn_with_its_reward():
    rollout = _rollout(AgentConfig(max_turns=2, max_total_tokens=200), turns=10)
    batch = episodes_to_batch(rollout, _tiny.tokenizer().pad_token_id)
    for row, episode in enumerate(rollout.episodes):
        assert episode.finish == "max_turns" and episode.turns == 2
        # Both turns were stepped (rewards 1 and 2); no observation follows the last turn.
        assert episode.reward == 3.0 and float(batch["scores"][row]) == 3.0
        first, second = episode.turn_ends
        assert episode.policy_mask == [1] * first + [0] * 3 + [1] * (second - first - 3)
        length = int(batch["response_lengths"][row])
        assert length == second and batch["loss_mask"][row, length - 1] == 1.0
    metrics = episode_metrics(rollout)
    assert metrics["agent/cut_max_turns"] == 4 and metrics["agent/cut_max_tokens"] == 0


@pytest.mark.parametrize("budget", [12, 15])
def test_token_limit_cuts_within_the_budget_and_ends_on_a_policy_id(budget: int):
    rollout = _rollout(AgentConfig(max_turns=10, max_total_tokens=budget), turns=10)
    for episode in rollout.episodes:
        assert episode.finish == "max_tokens"
        assert episode.num_tokens <= budget
        assert episode.policy_mask[-1] == 1
        # The turn that filled the budget was not stepped (the episode ended first); every other was.
        assert isinstance(episode.environment, CountingEnvironment)
        stepped = episode.environment.turns
        assert episode.reward == sum(t.turn + 1 for t in stepped)
        assert len(stepped) in (episode.turns, episode.turns - 1)
        # Every turn got at most the room it had: turn ends never pass the budget.
        assert all(len(episode.prompt_ids) + end <= budget for end in episode.turn_ends)
    assert episode_metrics(rollout)["agent/cut_max_tokens"] == 4


def test_fixed_widths_pad_every_row_alike():
    rollout = _rollout(AgentConfig(max_turns=2, max_total_tokens=40), turns=2)
    batch = episodes_to_batch(rollout, _tiny.tokenizer().pad_token_id, response_width=40, prompt_width=12)
    assert batch["input_ids"].shape == (4, 12) and batch["responses"].shape == (4, 40)
    for row, episode in enumerate(rollout.episodes):
        assert batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist() == episode.prompt_ids
        assert batch["responses"][row, : len(episode.response_ids)].tolist() == episode.response_ids
    with pytest.raises(ValueError, match="prompt_width=4"):
        episodes_to_batch(rollout, 0, prompt_width=4)


def test_a_prompt_that_fills_the_budget_is_refused_naming_the_row():
    with pytest.raises(ValueError, match="row 1: the first input has 8 ids"):
        _rollout(AgentConfig(max_turns=2, max_total_tokens=8), turns=2)
