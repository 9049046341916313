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
    top_fraction_mask,
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


def test_top_fraction_mask_by_hand():
    values = torch.tensor([[0.9, 0.1, 5.0], [0.5, 0.7, 0.3]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    # Valid values 0.9, 0.1, 0.5, 0.7, 0.3: the top 40% (2 of 5) are 0.9 and 0.7; 5.0 is padding.
    expected = torch.tensor([[True, False, False], [False, True, False]])
    assert torch.equal(top_fraction_mask(values, mask, 0.4), expected)
    assert not top_fraction_mask(values, mask, 0.0).any()
    assert torch.equal(top_fraction_mask(values, mask, 1.0), mask.bool())
    # ceil(0.3 * 5) = 2 entries, the same two.
    assert torch.equal(top_fraction_mask(values, mask, 0.3), expected)


def test_top_fraction_mask_past_quantile_limit():
    # torch.quantile refuses inputs over 2**24 elements; a batch of 64 x 300k tokens has more.
    generator = torch.Generator().manual_seed(0)
    values = torch.rand(2**24 + 4096, generator=generator)
    mask = torch.ones_like(values)
    kept = top_fraction_mask(values, mask, 0.2)
    assert int(kept.sum()) == math.ceil(0.2 * values.numel())
    assert values[kept].min() >= values[~kept].max()
