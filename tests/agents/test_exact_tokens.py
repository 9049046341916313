"""Exact tokens on the HF engine: the Batch the trainer reads holds the engine's sampled ids and the
environment's inserted ids, position by position; the mask covers exactly the sampled ids; the trainer's
log-probs of those ids equal the engine's."""

from __future__ import annotations

import functools

import pytest
import torch

from hybridflow.agents import (
    AgentConfig,
    TextCodec,
    episode_metrics,
    episodes_to_batch,
    make_environment,
    run_episodes,
)
from hybridflow.rollout import HFRolloutEngine, SamplingParams, response_log_probs
from tests.agents._scripted import CountingEnvironment
from tests.rollout import _tiny

PROMPTS = ("12+7=", "3*(4-1)=", "a", "ab+cd*9=")
SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=6, seed=None)


def _run(sampling: SamplingParams = SAMPLING, turns: int = 3):
    tokenizer = _tiny.tokenizer()
    model = _tiny.model()
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, seed=5)
    rows = [{"prompt": p} for p in PROMPTS for _ in range(2)]
    rollout = run_episodes(
        engine,
        rows,
        functools.partial(make_environment, "test_counting", turns=turns),
        TextCodec(tokenizer),
        sampling,
        AgentConfig(max_turns=5, max_total_tokens=64, tool_workers=4),
    )
    return tokenizer, model, rollout


@pytest.fixture(scope="module")
def sampled():
    """Eight sampled 3-turn episodes and the model and tokenizer that produced them."""
    return _run()


def test_trained_ids_are_the_sampled_and_inserted_ids_position_by_position(sampled):
    tokenizer, _, rollout = sampled
    batch = episodes_to_batch(rollout, tokenizer.pad_token_id)
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    for row, episode in enumerate(rollout.episodes):
        environment = episode.environment
        assert isinstance(environment, CountingEnvironment)
        assert len(environment.turns) == 3 and episode.finish == "done"
        # The ledger rebuilt from what the environment saw (the engine's ids) and returned (text).
        expected, expected_mask = [], []
        for i, turn in enumerate(environment.turns):
            expected += list(turn.token_ids)
            expected_mask += [1] * len(turn.token_ids)
            if i < len(environment.observations):
                inserted = encode(environment.observations[i])
                expected += inserted
                expected_mask += [0] * len(inserted)
        length = int(batch["response_lengths"][row])
        prompt = batch["input_ids"][row][batch["attention_mask"][row].bool()].tolist()
        assert prompt == encode(environment.prompt)
        assert batch["responses"][row, :length].tolist() == expected
        assert batch["loss_mask"][row, :length].tolist() == [float(m) for m in expected_mask]
        assert batch["loss_mask"][row, length:].sum() == 0
        assert batch["sampled_mask"][row].tolist() == batch["loss_mask"][row].long().tolist()
        assert batch["response_mask"][row, :length].tolist() == [1] * length
        # Rewards: 1 + 2 + 3, each at its turn's last sampled id.
        assert float(batch["scores"][row]) == 6.0
        ends = [e - 1 for e in episode.turn_ends]
        assert batch["turn_rewards"][row].nonzero().flatten().tolist() == ends
        assert batch["turn_rewards"][row, ends].tolist() == [1.0, 2.0, 3.0]
    # Sampled, not replayed: the 8 episodes (4 prompts twice) differ.
    assert len({tuple(e.response_ids) for e in rollout.episodes}) == 8


def test_trainer_log_probs_of_policy_ids_equal_the_engine_log_probs(sampled):
    tokenizer, model, rollout = sampled
    batch = episodes_to_batch(rollout, tokenizer.pad_token_id)
    recomputed = response_log_probs(model, batch, SAMPLING)
    policy = batch["loss_mask"].bool()
    inserted = batch["response_mask"].bool() & ~policy
    assert policy.sum() > 40 and inserted.sum() > 20
    gap = (recomputed - batch["rollout_log_probs"])[policy].abs().max()
    assert gap < 1e-4, gap
    # Inserted ids carry no engine log-prob; the trainer's own there is an ordinary (nonzero) value.
    assert batch["rollout_log_probs"][inserted].abs().max() == 0
    assert recomputed[inserted].abs().min() > 0


def test_metrics_count_turns_tokens_and_share(sampled):
    tokenizer, _, rollout = sampled
    metrics = episode_metrics(rollout)
    episodes = rollout.episodes
    inserted = sum(e.policy_mask.count(0) for e in episodes)
    total = sum(len(e.response_ids) for e in episodes)
    assert metrics["agent/turns_mean"] == 3.0
    assert metrics["agent/masked_token_share"] == inserted / total
    # "=0(" and "=1(": 3 inserted ids each, two observations per episode.
    assert inserted == 8 * 6
    assert metrics["agent/cut_max_turns"] == 0 and metrics["agent/cut_max_tokens"] == 0
    assert metrics["agent/reward_mean"] == 6.0
    # Plain text and a character tokenizer: re-encoding the history (sampled special ids written out,
    # as the end-of-sequence ids that ended turns here) reproduces the ledger: no drift.
    specials = {
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.unk_token_id,
    }
    assert any(set(e.response_ids) & specials for e in episodes)
    assert metrics["agent/drift_turns"] == 0
    assert metrics["agent/tool_calls"] == 0
    assert 0 < metrics["agent/generation_seconds"] <= metrics["agent/wall_seconds"]


def test_greedy_turns_continue_the_ledger_as_one_long_generation_would():
    """A greedy turn after a prefix is the greedy continuation of exactly that prefix's ids."""
    tokenizer, model, rollout = _run(SamplingParams(temperature=0, max_new_tokens=6), turns=2)
    for episode in rollout.episodes:
        first_turn_end = episode.turn_ends[0]
        observation_end = first_turn_end + 3
        context = torch.tensor([episode.prompt_ids + episode.response_ids[:observation_end]])
        expected = model.generate(
            context,
            attention_mask=torch.ones_like(context),
            do_sample=False,
            max_new_tokens=6,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[0, context.shape[1] :].tolist()
        second = episode.response_ids[observation_end : episode.turn_ends[1]]
        assert second == expected[: len(second)]
        assert len(second) == 6 or second[-1] == tokenizer.eos_token_id
