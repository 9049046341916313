"""The monitor's pure signal functions against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from hybridflow.metrics.monitor import (
    MonitorConfig,
    batch_repetition,
    equal_reward_groups,
    repeated_ngram_share,
    standardized_change,
    window_change,
)


def test_window_change_is_the_fitted_line_across_the_window():
    assert window_change([1.0, 2.0, 3.0, 4.0]) == pytest.approx(3.0)
    # Least squares on x = 0, 1, 2: slope 1.5, over 2 steps = 3 (endpoints alone would say 2).
    assert window_change([0.0, 4.0, 2.0 + 1.0]) == pytest.approx(1.5 * 2)
    assert window_change([5.0, 5.0, 5.0]) == 0.0
    with pytest.raises(ValueError, match="at least 2 values"):
        window_change([1.0])


def test_standardized_change_uses_the_pooled_standard_deviation():
    # change 3; pooled variance = mean(1, 1, 1, 1) + var(0, 1, 2, 3) = 1 + 1.25 -> std 1.5.
    assert standardized_change([0.0, 1.0, 2.0, 3.0], [1.0] * 4) == pytest.approx(2.0)
    assert standardized_change([0.5, 0.5], [0.0, 0.0]) == 0.0
    with pytest.raises(ValueError, match="2 means but 1 variances"):
        standardized_change([0.0, 1.0], [1.0])


def test_repeated_ngram_share_by_hand():
    assert repeated_ngram_share([1, 2, 1, 2, 1, 2], 2) == pytest.approx(3 / 5)
    assert repeated_ngram_share([1, 2, 3, 4, 5], 2) == 0.0
    assert repeated_ngram_share([7, 7, 7, 7], 1) == pytest.approx(3 / 4)
    assert repeated_ngram_share([1, 2], 3) is None


def test_batch_repetition_reads_only_response_tokens():
    responses = torch.tensor([[1, 2, 1, 2, 1, 2, 9, 9], [3, 4, 5, 0, 0, 0, 0, 0], [6, 0, 0, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]])
    # Row 0: 0.6 (the 9s are padding); row 1: 0.0; row 2 is shorter than a bigram and does not count.
    assert batch_repetition(responses, mask, 2) == pytest.approx(0.3)
    assert batch_repetition(responses[2:], mask[2:], 2) is None


def test_equal_reward_groups_leaves_out_single_samples():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 3, 3])
    # Group 0 equal, group 1 not, group 2 has one sample, group 3 equal.
    assert equal_reward_groups(scores, groups) == (2, 3)
    assert equal_reward_groups(torch.tensor([1.0, 0.0]), torch.tensor([0, 1])) == (0, 0)
    two_level = torch.tensor([[0, 0], [0, 0], [0, 1], [0, 1]])
    assert equal_reward_groups(torch.tensor([1.0, 1.0, 1.0, 0.0]), two_level) == (1, 2)


def test_monitor_config_checks_the_declared_ranges():
    with pytest.raises(ValueError, match=r"monitor\.psi_threshold: must be > 0, got -0.1"):
        MonitorConfig(psi_threshold=-0.1)
    with pytest.raises(ValueError, match=r"monitor\.ks_threshold: must be > 0 and <= 1, got 1.5"):
        MonitorConfig(ks_threshold=1.5)
    assert MonitorConfig(psi_threshold=None).psi_threshold is None
