"""The parts of partial rollouts that need no Ray: the prompt stream's held prompts across a checkpoint,
and which groups must finish in a step (the staleness bound)."""

from __future__ import annotations

import pytest

from hybridflow.data import PromptLoader
from tests.rollout_service._toy_prompts import ids, toy_loader
from trainer.rollout_queue import OWED_KEY, PartialPool, PromptStream


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
