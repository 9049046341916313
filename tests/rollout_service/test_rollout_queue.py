"""The parts of generation ahead that need no Ray: the prompt stream's look-ahead and data position, the
staleness metrics, and the config rule."""

from __future__ import annotations

import pytest
import torch

from hybridflow.data import PromptLoader, write_rows
from hybridflow.protocol import Batch
from tests.rollout_service._toy_prompts import ids, toy_loader
from trainer.config import ConfigError, load_config
from trainer.rollout_queue import PromptStream, StalenessError, staleness_metrics


@pytest.fixture
def loader(tmp_path) -> PromptLoader:
    return toy_loader(tmp_path, 10)


def test_peeking_takes_nothing_from_the_data_order(loader):
    reference = PromptLoader(loader.dataset, 3, 0, seed=5)
    order = [ids(b) for b in reference] + [ids(b) for b in reference]  # two epochs of 3 batches
    stream = PromptStream(loader)
    first = stream.next()
    ahead = [stream.peek(0), stream.peek(1), stream.peek(3)]  # across the epoch's end
    assert stream.next() is ahead[0] and stream.next() is ahead[1]
    taken = [first, ahead[0], ahead[1], stream.next(), stream.next(), stream.next()]
    assert [ids(b) for b in taken] == order
    assert taken[4] is ahead[2]


def test_the_data_position_leaves_out_batches_only_peeked(loader):
    stream = PromptStream(loader)
    stream.next()
    stream.next()
    position = stream.state_dict()
    assert position == {**loader.state_dict(), "position": 2}
    stream.peek(0)
    stream.peek(1)  # the loader moved on two batches, into the next epoch ...
    assert stream.state_dict() == position  # ... the saved position did not
    resumed = PromptLoader(loader.dataset, 3, 0, seed=5)
    resumed.load_state_dict(position)
    again = PromptStream(resumed)
    assert ids(again.next()) == ids(stream.next())
    assert ids(again.next()) == ids(stream.next())


def _rows(versions: list[int], lengths: list[int]) -> Batch:
    mask = torch.zeros(len(lengths), 4)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return Batch({"response_mask": mask, "policy_version": torch.tensor(versions)})


def test_staleness_counts_response_tokens_by_version():
    # Trainer at version 5: rows of versions 5, 4, 4, 3 with 2, 3, 1, 4 tokens; the empty row of
    # version 3 counts for no token and not for the maximum.
    rows = _rows([5, 4, 4, 3, 3], [2, 3, 1, 4, 0])
    metrics = staleness_metrics(rows, 5, 2, {})
    assert metrics["async/tokens_staleness_0"] == 2
    assert metrics["async/tokens_staleness_1"] == 4
    assert metrics["async/tokens_staleness_2"] == 4
    assert metrics["async/staleness_mean"] == pytest.approx((0 * 2 + 1 * 4 + 2 * 4) / 10)
    assert metrics["async/staleness_max"] == 2
    # A second batch in the same step adds to the first.
    more = staleness_metrics(_rows([5], [3]), 5, 2, metrics)
    assert more["async/tokens_staleness_0"] == 5
    assert more["async/staleness_mean"] == pytest.approx(12 / 13)
    assert more["async/staleness_max"] == 2


def test_a_row_beyond_the_bound_fails_naming_it():
    with pytest.raises(StalenessError, match=r"versions \[2, 4\] reached the trainer at version 4; .*max_staleness=1"):
        staleness_metrics(_rows([4, 2], [1, 1]), 4, 1, {})
    with pytest.raises(StalenessError):
        staleness_metrics(_rows([5], [1]), 4, 1, {})  # a version the trainer has not made


def test_generating_ahead_needs_a_rollout_pool(tmp_path):
    write_rows(
        [{"data_source": "toy", "prompt": [{"role": "user", "content": "1="}], "reward_model": {"ground_truth": "1"}}],
        tmp_path / "train.jsonl",
    )
    base = [f"data.train_files=[{tmp_path / 'train.jsonl'}]", f"trainer.output_dir={tmp_path / 'out'}"]
    with pytest.raises(ConfigError, match=r"async_rollout\.max_staleness: 1 generates ahead .* pool of its own"):
        load_config(None, [*base, "async_rollout.max_staleness=1"])
    with pytest.raises(ConfigError, match=r"async_rollout\.max_staleness: must be >= 0, got -1"):
        load_config(None, [*base, "async_rollout.max_staleness=-1"])
    split = ["resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}", "resource.placement={rollout: rollout_pool}"]
    assert load_config(None, [*base, *split, "async_rollout.max_staleness=2"]).async_rollout.max_staleness == 2
    with pytest.raises(ConfigError, match=r"resharding\.max_log_prob_gap: rows generated ahead"):
        load_config(None, [*base, *split, "async_rollout.max_staleness=1", "resharding.max_log_prob_gap=0.001"])
