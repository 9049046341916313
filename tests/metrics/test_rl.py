"""RL step metrics on a small hand-built Batch with known answers."""

from __future__ import annotations

import pytest
import torch

from hybridflow.metrics import step_metrics, zero_variance_group_fraction
from hybridflow.protocol import Batch


@pytest.fixture
def batch() -> Batch:
    """Two prompts x two samples. Group 0 scores 1 and 1 (no variance); group 1 scores 0 and 1."""
    response_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    rollout = torch.tensor(
        [[-0.5, -1.0, -2.0, 0.0], [-0.1, -0.2, 0.0, 0.0], [-1.0, -1.0, -1.0, -1.0], [-3.0, 0.0, 0.0, 0.0]]
    )
    old = rollout.clone()
    old[0, 1] += 0.25  # the only real gap
    old[1, 3] = 9.0  # on padding: must be ignored
    advantages = torch.tensor(
        [[0.0, 0.0, 0.0, 7.0], [0.0, 0.0, 7.0, 7.0], [1.0, 1.0, 1.0, 1.0], [-1.0, 7.0, 7.0, 7.0]]
    )
    return Batch(
        {
            "response_mask": response_mask,
            "scores": torch.tensor([1.0, 1.0, 0.0, 1.0]),
            "group_ids": torch.tensor([0, 0, 1, 1]),
            "rollout_log_probs": rollout,
            "old_log_probs": old,
            "advantages": advantages,
        },
        {"finish_reason": ["stop", "stop", "length", "stop"]},
    )


def test_step_metrics_on_a_hand_built_batch(batch):
    metrics = step_metrics(batch)
    assert metrics["score/mean"] == 0.75
    assert (metrics["score/min"], metrics["score/max"]) == (0.0, 1.0)
    assert metrics["score/std"] == pytest.approx(0.4330127)  # population std of 1, 1, 0, 1
    assert metrics["group/zero_variance_frac"] == 0.5
    assert metrics["group/count"] == 2.0
    assert metrics["response/truncation_rate"] == 0.25
    # lengths 3, 2, 4, 1
    assert metrics["response_length/mean"] == 2.5
    assert (metrics["response_length/min"], metrics["response_length/max"]) == (1.0, 4.0)
    # 10 response tokens, one differs by 0.25
    assert metrics["sync/log_prob_abs_diff_mean"] == pytest.approx(0.025)
    assert metrics["sync/log_prob_abs_diff_max"] == pytest.approx(0.25)
    # advantages over the 10 response tokens: four 1s and one -1, the rest 0; the 7s sit on padding
    assert metrics["advantage/mean"] == pytest.approx(0.3)
    assert metrics["advantage/max"] == 1.0


def test_rewards_are_summed_per_sample_over_response_tokens():
    batch = Batch(
        {
            "response_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
            "token_level_rewards": torch.tensor([[0.5, 1.0, 100.0], [-1.0, 100.0, 100.0]]),
            "group_ids": torch.tensor([3, 3]),
        }
    )
    metrics = step_metrics(batch)
    assert (metrics["reward/max"], metrics["reward/min"]) == (1.5, -1.0)
    assert "score/mean" not in metrics
    assert metrics["group/zero_variance_frac"] == 0.0


def test_zero_variance_with_hierarchical_and_singleton_groups():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.3])
    # finest groups: (0,0) -> 1,1 ; (0,1) -> 0,1 ; (1,0) -> 0.3 alone
    group_ids = torch.tensor([[0, 0], [0, 0], [0, 1], [0, 1], [1, 0]])
    assert zero_variance_group_fraction(scores, group_ids) == pytest.approx(2 / 3)


def test_metrics_skip_missing_columns():
    assert step_metrics(Batch({"response_mask": torch.ones(2, 3)})) == {
        "response_length/mean": 3.0,
        "response_length/std": 0.0,
        "response_length/min": 3.0,
        "response_length/max": 3.0,
    }
