"""PSI and KS against hand-computed values, their edge cases, and the per-source window tracker."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.metrics import RewardDriftTracker, ks_statistic, population_stability_index


def test_psi_of_a_quantile_split_by_hand():
    # bins=2: one cut at the reference median 2.5; reference 2/4 | 2/4, current 3/4 | 1/4.
    expected = (0.75 - 0.5) * math.log(0.75 / 0.5) + (0.25 - 0.5) * math.log(0.25 / 0.5)
    assert population_stability_index([1, 2, 3, 4], [1, 1, 1, 4], bins=2) == pytest.approx(
        expected, abs=1e-12
    )
    assert expected == pytest.approx(0.274653, abs=1e-6)


def test_psi_of_a_binary_reward_gets_one_bin_per_level():
    # Reference 40% ones, current 80%: the quartile cuts of a 0/1 reference collapse to {0, 1}, so the
    # bins are (-inf, 0], (0, 1], (1, inf) and the last is empty on both sides.
    reference = [0.0] * 6 + [1.0] * 4
    current = [0.0] * 2 + [1.0] * 8
    expected = (0.2 - 0.6) * math.log(0.2 / 0.6) + (0.8 - 0.4) * math.log(0.8 / 0.4)
    assert expected == pytest.approx(0.4 * math.log(6))
    assert population_stability_index(reference, current, bins=4) == pytest.approx(expected, abs=1e-12)


def test_psi_edge_cases():
    same = torch.linspace(0, 1, 50)
    assert population_stability_index(same, same) == 0.0
    assert population_stability_index([0.5] * 5, [0.5] * 7) == 0.0
    # Disjoint constants share no bin: both shares are floored at eps.
    eps = 1e-4
    assert population_stability_index([0.0] * 8, [1.0] * 8, eps=eps) == pytest.approx(
        2 * (1 - eps) * math.log(1 / eps)
    )
    with pytest.raises(ValueError, match="reference window is empty"):
        population_stability_index([], [1.0])
    with pytest.raises(ValueError, match="current window is empty"):
        population_stability_index([1.0], torch.tensor([]))
    with pytest.raises(ValueError, match="current window holds a NaN"):
        population_stability_index([1.0], [float("nan")])
    with pytest.raises(ValueError, match="bins >= 2"):
        population_stability_index([1.0], [1.0], bins=1)


def test_ks_by_hand_and_edge_cases():
    # ECDFs at x=2: 0.5 vs 0; at x=4: 1 vs 0.5.
    assert ks_statistic([1, 2, 3, 4], [3, 4, 5, 6]) == 0.5
    assert ks_statistic([0.0] * 6 + [1.0] * 4, [0.0] * 2 + [1.0] * 8) == pytest.approx(0.4)
    assert ks_statistic([2.0, 2.0], [2.0]) == 0.0
    assert ks_statistic([0.0, 0.0], [1.0]) == 1.0
    with pytest.raises(ValueError, match="reference window is empty"):
        ks_statistic([], [1.0])
    with pytest.raises(ValueError, match="reference window holds a NaN"):
        ks_statistic([float("inf")], [1.0])


def test_ks_matches_a_brute_force_supremum_on_random_samples():
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(200, generator=generator).round(decimals=1)  # ties included
    current = (torch.randn(150, generator=generator) * 1.3 + 0.4).round(decimals=1)
    brute = max(
        abs((reference <= x).double().mean().item() - (current <= x).double().mean().item())
        for x in torch.cat([reference, current]).tolist()
    )
    assert ks_statistic(reference, current) == pytest.approx(brute, abs=1e-12)


def test_previous_reference_is_the_window_just_before_the_current_one():
    tracker = RewardDriftTracker(window=3, reference="previous")
    tracker.add(["a", "b", "a"], [1.0, 10.0, 2.0])
    tracker.add(["a"] * 3, [3.0, 4.0, 5.0])
    assert tracker.windows("a") is None  # 5 of the 6 rewards needed
    tracker.add(["a", "a"], [6.0, 7.0])
    assert tracker.windows("a") == ([2.0, 3.0, 4.0], [5.0, 6.0, 7.0])
    assert tracker.windows("b") is None
    scores = tracker.scores(bins=2)
    assert list(scores) == ["a"]
    assert scores["a"].ks == 1.0
    assert scores["a"].psi == pytest.approx(population_stability_index([2, 3, 4], [5, 6, 7], bins=2))


def test_first_reference_stays_frozen():
    tracker = RewardDriftTracker(window=2, reference="first")
    tracker.add(["s"] * 5, [0.0, 1.0, 5.0, 6.0, 7.0])
    assert tracker.windows("s") == ([0.0, 1.0], [6.0, 7.0])
    assert tracker.sources == ["s"]


def test_tracker_state_round_trip_and_bad_input():
    tracker = RewardDriftTracker(window=2)
    tracker.add(["x"] * 3, [1.0, 2.0, 3.0])
    restored = RewardDriftTracker(window=2)
    restored.load_state_dict(tracker.state_dict())
    for each in (tracker, restored):
        each.add(["x"], [4.0])
    assert restored.windows("x") == tracker.windows("x") == ([1.0, 2.0], [3.0, 4.0])
    with pytest.raises(ValueError, match="2 data sources for 1 rewards"):
        tracker.add(["x", "y"], [1.0])
    with pytest.raises(ValueError, match="'previous' or 'first'"):
        RewardDriftTracker(window=2, reference="last")  # type: ignore[arg-type]
