"""The parts of partial rollouts that need no Ray: the prompt stream's held prompts and the pool's paused
samples across a checkpoint, and which groups must finish in a step (the staleness bound)."""

from __future__ import annotations

import pytest
import torch

from hybridflow.data import PromptLoader
from tests.rollout_service._toy_prompts import ids, toy_loader
from trainer.rollout_queue import OWED_KEY, PARTIAL_FILE, PartialPool, PendingRound, PromptStream


@pytest.fixture
def loader(tmp_path) -> PromptLoader:
    return toy_loader(tmp_path, 12)


def test_held_prompts_come_back_first_after_a_resume_and_batches_keep_their_size(loader):
    order = [i for batch in PromptLoader(loader.dataset, 3, 0, seed=5) for i in ids(batch)]
    stream = PromptStream(loader)
    first, second = stream.next(), stream.next()
    assert ids(first) + ids(second) == order[:6]
    stream.hold(first)
    stream.hold(second)
    stream.release([ids(first)[1], *ids(second)[:2]])  # trained: 4 of the 6; held: order[0], order[2], order[5]
    held = [order[0], order[2], order[5]]
    state = stream.state_dict()
    assert state[OWED_KEY] == held
    assert state["position"] == 2  # the loader's position after both batches

    resumed = PromptStream(PromptLoader(loader.dataset, 3, 0, seed=5))
    resumed.load_state_dict(state)
    assert ids(resumed.next()) == held  # exactly one batch's worth: no top-up needed
    assert ids(resumed.next()) == order[6:9]  # then the data order where the checkpoint left it
    # Held prompts are listed while untrained, and none twice.
    again = PromptStream(PromptLoader(loader.dataset, 3, 0, seed=5))
    again.load_state_dict({**state, OWED_KEY: held[:2]})
    topped = again.next()
    assert ids(topped) == [*held[:2], order[6]]  # 2 owed, topped up from the loader's next batch
    assert again.state_dict()[OWED_KEY] == order[7:9]  # the rest of that batch is owed, not lost
    assert ids(again.next()) == [*order[7:9], order[9]]


def test_without_held_prompts_the_state_is_the_loaders(loader):
    stream = PromptStream(loader)
    batch = stream.next()
    stream.hold(batch)
    stream.release(ids(batch))
    assert stream.state_dict() == loader.state_dict()


def test_groups_started_max_staleness_versions_ago_are_due(loader):
    stream = PromptStream(loader)
    pool = PartialPool()
    pool.start(stream.next(), n=2, version=3)
    pool.start(stream.next(), n=2, version=4)
    due, rest = pool.unfinished(version=5, max_staleness=2)
    assert len(due) == 6 and len(rest) == 6  # the version-3 prompts reach the bound at version 5
    assert {s.group for s in due} == {0, 1, 2}
    for sample in due:
        sample.finish_reason = "stop"
    assert pool.complete() == 3
    taken = pool.take(2)
    assert [g.version for g in taken] == [3, 3] and len(pool) == 4


def test_a_prompt_handed_out_again_while_held_is_held_twice(loader):
    """An epoch ends while prompts of it still run: the next epoch hands them out again, and each start
    is held, listed in a checkpoint and released on its own."""
    stream = PromptStream(loader)
    first_epoch = [i for _ in range(4) for i in ids(stream.next())]  # 12 prompts, batches of 3
    second_epoch = stream.next()
    stream.hold(loader.collate([loader.dataset[i] for i in first_epoch]))
    stream.hold(second_epoch)
    again = ids(second_epoch)
    assert sorted(stream.state_dict()[OWED_KEY]) == sorted(first_epoch + again)  # 15: 3 prompts twice
    stream.release(first_epoch)
    assert sorted(stream.state_dict()[OWED_KEY]) == sorted(again)
    stream.release(again)
    assert OWED_KEY not in stream.state_dict()
    with pytest.raises(KeyError, match=f"prompt {again[0]} is not held"):
        stream.release(again[:1])


def test_a_checkpointed_pool_comes_back_sample_by_sample_and_its_prompts_are_held_not_owed(loader, tmp_path):
    order = [i for batch in PromptLoader(loader.dataset, 3, 0, seed=5) for i in ids(batch)]
    stream = PromptStream(loader)
    pool = PartialPool()
    for version in (3, 4):
        batch = stream.next()
        pool.start(batch, n=2, version=version)
        stream.hold(batch)
    # The first prompt's samples finished, the others paused with 0-2 tokens of versions 3 and 4.
    for k, sample in enumerate(s for group in pool.groups for s in group.samples):
        sample.token_ids = [7 + k] * (k % 3)
        sample.log_probs = [-0.1 * (k + 1)] * (k % 3)
        sample.versions = [3 + k % 2] * (k % 3)
        sample.rounds = k % 3
        sample.finish_reason = "stop" if k < 2 else None
    trained = pool.take(1)
    stream.release([group.index for group in trained])
    # A round left running on the rollout pool started the stream's next batch (only peeked): the
    # checkpoint keeps its groups and counts the batch as handed out and held.
    admitted = stream.peek(0)
    pool.start(admitted, n=2, version=5)
    pool.pending = PendingRound([], 5, admitted, 8)
    with pytest.raises(ValueError, match="the look-ahead's first batch"):
        stream.state_dict(started=stream.peek(1))
    assert stream.state_dict()["position"] == 2  # without it: before the admitted batch
    state = stream.state_dict(started=admitted)
    assert state["position"] == 3 and state[OWED_KEY] == order[1:9]
    torch.save(pool.state_dict(), tmp_path / PARTIAL_FILE)

    restored = PartialPool()
    restored.load_state_dict(torch.load(tmp_path / PARTIAL_FILE, weights_only=True), loader.dataset, 0)
    assert [(g.index, g.version, g.samples) for g in restored.groups] == [
        (g.index, g.version, g.samples) for g in pool.groups
    ]
    assert [g.index for g in restored.groups] == order[1:9] and restored.pending is None
    assert [g.version for g in restored.groups] == [3, 3, 4, 4, 4, 5, 5, 5]
    for mine, theirs in zip(restored.groups, pool.groups, strict=True):
        for column in ("input_ids", "attention_mask", "position_ids"):
            assert torch.equal(mine.prompt[column], theirs.prompt[column])  # padded as in the batch it started in
        assert mine.prompt.non_tensors == theirs.prompt.non_tensors
    # Some rows are wider than their own prompt: the saved width matters.
    assert any(g.prompt["input_ids"].shape[1] > len(g.samples[0].prompt_ids) for g in restored.groups)

    resumed = PromptStream(PromptLoader(loader.dataset, 3, 0, seed=5))
    resumed.load_state_dict(state, kept=[g.index for g in restored.groups])
    assert not resumed.owes  # nothing to start again
    assert ids(resumed.next()) == order[9:12]  # the batch after the admitted one
    assert sorted(resumed.state_dict()[OWED_KEY]) == sorted(order[1:9])  # held again, listed by a checkpoint
    resumed.release(order[1:9])
    assert OWED_KEY not in resumed.state_dict()

    # Held prompts a checkpoint has no samples of are owed, in the listed order; kept ones must be listed.
    partly = PromptStream(PromptLoader(loader.dataset, 3, 0, seed=5))
    partly.load_state_dict(state, kept=order[2:5])
    assert ids(partly.next()) == [order[1], order[5], order[6]]
    assert ids(partly.next()) == [*order[7:9], order[9]]
    with pytest.raises(ValueError, match=rf"prompts \[{order[10]}\] are kept by the partial-rollout pool"):
        PromptStream(loader).load_state_dict(state, kept=[order[10]])
