"""The rollout-vs-trainer gap of an episode Batch counts the sampled ids only: inserted ids have no
engine log-prob (0 in ``rollout_log_probs``; 0 in the episode's ``sampled_mask``), so comparing them would
report a stale engine that is not."""

from __future__ import annotations

import torch

from hybridflow.metrics.rl import log_prob_gap_metrics
from hybridflow.protocol import Batch


def test_inserted_ids_do_not_count_in_the_gap():
    columns = {
        "response_mask": torch.tensor([[1, 1, 1, 1, 0]]),
        # sampled, inserted, inserted, sampled, padding
        "sampled_mask": torch.tensor([[1, 0, 0, 1, 0]]),
        "rollout_log_probs": torch.tensor([[-0.5, 0.0, 0.0, -0.25, 0.0]]),
        "old_log_probs": torch.tensor([[-0.5, -3.0, -4.0, -0.75, -9.0]]),
    }
    gap = log_prob_gap_metrics(Batch(columns))
    # By hand over the two sampled ids: |0| and |0.5|.
    assert gap == {"sync/log_prob_abs_diff_mean": 0.25, "sync/log_prob_abs_diff_max": 0.5}
    without = {key: value for key, value in columns.items() if key != "sampled_mask"}
    assert log_prob_gap_metrics(Batch(without))["sync/log_prob_abs_diff_max"] == 4.0
