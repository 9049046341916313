"""Masked statistics and group statistics."""

import math

import torch
from torch.testing import assert_close

from hybridflow.algos import (
    group_index,
    group_stats,
    last_valid_token_mask,
    masked_mean,
    masked_var,
    masked_whiten,
)

X = torch.tensor([[1.0, 2.0, math.nan], [3.0, math.inf, 6.0]])
M = torch.tensor([[1, 1, 0], [1, 0, 1]])


def test_masked_mean_and_var_by_hand():
    # Valid: 1, 2, 3, 6 -> mean 3; squared deviations 4, 1, 0, 9 -> var 14/3 (Bessel) or 14/4.
    assert_close(masked_mean(X, M), torch.tensor(3.0))
    assert_close(masked_mean(X, M, dim=-1), torch.tensor([1.5, 4.5]))
    assert_close(masked_var(X, M), torch.tensor(14 / 3))
    assert_close(masked_var(X, M, unbiased=False), torch.tensor(14 / 4))


def test_masked_whiten_by_hand():
    s = math.sqrt(14 / 3 + 1e-8)
    expected = torch.tensor([[(1 - 3) / s, (2 - 3) / s, 0.0], [(3 - 3) / s, 0.0, (6 - 3) / s]])
    assert_close(masked_whiten(X, M), expected)
    assert_close(masked_whiten(X, M, shift_mean=False), expected + 3.0 * M)


def test_last_valid_token_mask():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 1]])
    expected = torch.tensor([[0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(last_valid_token_mask(mask), expected)


def test_group_stats_unequal_groups():
    # Group 5: [1, 0, 1] (mean 2/3, std sqrt(1/3)); group 2: [0.5] (std 0 by convention).
    stats = group_stats(torch.tensor([1.0, 0.5, 0.0, 1.0]), torch.tensor([5, 2, 5, 5]))
    assert_close(stats.count, torch.tensor([3.0, 1.0, 3.0, 3.0]))
    assert_close(stats.mean, torch.tensor([2 / 3, 0.5, 2 / 3, 2 / 3]))
    assert_close(stats.std, torch.tensor([math.sqrt(1 / 3), 0.0, math.sqrt(1 / 3), math.sqrt(1 / 3)]))
    assert_close(stats.sum, torch.tensor([2.0, 0.5, 2.0, 2.0]))


def test_group_index_two_levels():
    index, n = group_index(torch.tensor([[0, 0], [1, 0], [0, 0], [0, 1]]))
    assert n == 3
    assert index[0] == index[2]
    assert len({int(index[0]), int(index[1]), int(index[3])}) == 3
