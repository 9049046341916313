"""Clip-Cov and KL-Cov against numbers worked out by hand: token covariance, selection, values, gradients.

Row 0 has three valid tokens, row 1 two and a padded position holding junk.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import clip_cov_loss, compute_policy_loss, kl_cov_loss, token_covariance


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


LOG_PROB = [[-0.5, -3.0, -0.2], [-2.5, -0.3, 4.0]]
ADV = t([[2.0, 2.0, 2.0], [-1.0, -1.0, 7.0]])
MASK = t([[1, 1, 1], [1, 1, 0]])
# Means over the 5 valid tokens: log-prob (-0.5 - 3 - 0.2 - 2.5 - 0.3) / 5 = -1.3; A (3 * 2 - 2) / 5 = 0.8.
# cov = (log_prob + 1.3) * (A - 0.8):
COV = [
    [0.8 * 1.2, -1.7 * 1.2, 1.1 * 1.2],
    [-1.2 * -1.8, 1.0 * -1.8, 0.0],
]  # t0..t4 = .96 -2.04 1.32 2.16 -1.8


def old_for(ratios):
    """Old log-probs giving the ratios ``ratios`` (row-major over all 6 positions) against ``LOG_PROB``."""
    flat = [lp - math.log(r) for lp, r in zip(LOG_PROB[0] + LOG_PROB[1], ratios, strict=True)]
    return t([flat[:3], flat[3:]])


def test_token_covariance_by_hand():
    assert_close(token_covariance(t(LOG_PROB), ADV, MASK), t(COV))


# --------------------------------------------------------------------------------------------- Clip-Cov


def test_clip_cov_freezes_in_band_tokens_that_ppo_did_not_clip():
    # Ratios t0..t4 = 1.1, 0.9, 1.05, 0.7, 0.95. t3 (A = -1, r = 0.7) is clipped by PPO (0.8 > 0.7), so of
    # the two tokens with 1 < cov < 5 (t2: 1.32, t3: 2.16) only t2 is a candidate.
    old = old_for([1.1, 0.9, 1.05, 0.7, 0.95, 1.0])
    log_prob = t(LOG_PROB).requires_grad_(True)
    # Budget max(1, floor(0.5 * 5)) = 2 exceeds the one candidate: t2 is frozen for sure.
    loss, metrics = clip_cov_loss(log_prob, old, ADV, MASK, clip_cov_ratio=0.5)
    # Values are PPO's (a frozen token keeps its value): -A r, and max(0.7, 0.8) = 0.8 for t3.
    assert_close(loss, torch.tensor((-2 * 1.1 - 2 * 0.9 - 2 * 1.05 + 0.8 + 0.95) / 5))
    assert_close(metrics["cov_clip_frac"], torch.tensor(1 / 5))
    assert_close(metrics["clip_frac"], torch.tensor(2 / 5))
    loss.backward()
    # Gradient -A r / 5 except at t2 (frozen) and t3 (PPO-clipped).
    assert_close(log_prob.grad, t([[-2.2 / 5, -1.8 / 5, 0.0], [0.0, 0.95 / 5, 0.0]]))


def test_clip_cov_draws_its_budget_at_random_among_candidates():
    # No PPO clip now: candidates t2 and t3; the default ratio 2e-4 gives a budget of max(1, 0) = 1.
    old = old_for([1.1, 0.9, 1.05, 1.0, 0.95, 1.0])
    frozen = []
    for seed in range(8):
        log_prob = t(LOG_PROB).requires_grad_(True)
        generator = torch.Generator().manual_seed(seed)
        loss, metrics = clip_cov_loss(log_prob, old, ADV, MASK, generator=generator)
        loss.backward()
        zero = (log_prob.grad == 0) & MASK.bool()
        assert_close(metrics["cov_clip_frac"], torch.tensor(1 / 5))
        assert int(zero.sum()) == 1 and (bool(zero[0, 2]) or bool(zero[1, 0]))
        frozen.append((int(zero[0, 2]), int(zero[1, 0])))
        # The others keep gradient -A r / 5.
        expected = t([[-2.2 / 5, -1.8 / 5, -2.1 / 5], [1.0 / 5, 0.95 / 5, 0.0]])
        assert_close(log_prob.grad[~zero], expected[~zero])
    assert {(1, 0), (0, 1)} == set(frozen)  # both candidates are drawn over the seeds


def test_clip_cov_band_bounds_are_parameters():
    # Band (2, 5): only t3 (2.16); band (-3, -2): only t1 (-2.04). Budget 2 covers each.
    old = old_for([1.1, 0.9, 1.05, 1.0, 0.95, 1.0])
    for lb, ub, position in ((2.0, 5.0, (1, 0)), (-3.0, -2.0, (0, 1))):
        log_prob = t(LOG_PROB).requires_grad_(True)
        loss, _ = compute_policy_loss(
            "clip_cov", log_prob, old, ADV, MASK, clip_cov_ratio=0.5, clip_cov_lb=lb, clip_cov_ub=ub
        )
        loss.backward()
        zero = (log_prob.grad == 0) & MASK.bool()
        assert zero.nonzero().tolist() == [list(position)]
    with pytest.raises(ValueError, match="clip_cov_lb < clip_cov_ub"):
        clip_cov_loss(t(LOG_PROB), old, ADV, MASK, clip_cov_lb=5.0, clip_cov_ub=1.0)


# --------------------------------------------------------------------------------------------- KL-Cov


def test_kl_cov_penalises_the_top_covariance_tokens():
    # Ratios t0..t4 = 1.1, 0.9, 1.05, 0.7, 0.95; no clip anywhere.
    ratios = [1.1, 0.9, 1.05, 0.7, 0.95]
    old = old_for([*ratios, 1.0])
    log_prob = t(LOG_PROB).requires_grad_(True)
    # k = floor(0.4 * 5) = 2: the top covariances are t3 (2.16) and t2 (1.32).
    loss, metrics = kl_cov_loss(log_prob, old, ADV, MASK, kl_cov_ratio=0.4, kl_coef=0.5)
    base = [-2 * 1.1, -2 * 0.9, -2 * 1.05, 0.7, 0.95]
    penalty = [0.0, 0.0, 0.5 * abs(math.log(1.05)), 0.5 * abs(math.log(0.7)), 0.0]
    assert_close(loss, torch.tensor(sum(b + p for b, p in zip(base, penalty, strict=True)) / 5))
    assert_close(metrics["kl_cov_frac"], torch.tensor(2 / 5))
    loss.backward()
    # -A r, plus kl_coef * sign(log r) on the penalised tokens (log 1.05 > 0, log 0.7 < 0).
    expected = [[-2.2, -1.8, -2.1 + 0.5], [0.7 - 0.5, 0.95, 0.0]]
    assert_close(log_prob.grad, t(expected) / 5)


def test_kl_cov_default_share_keeps_at_least_one_token():
    # Default kl_cov_ratio 2e-3 of 5 tokens -> k = max(1, 0) = 1: only t3; default kl_coef 1.
    old = old_for([1.1, 0.9, 1.05, 0.7, 0.95, 1.0])
    log_prob = t(LOG_PROB).requires_grad_(True)
    loss, metrics = kl_cov_loss(log_prob, old, ADV, MASK)
    assert_close(loss, torch.tensor((-2.2 - 1.8 - 2.1 + 0.7 + 0.95 + abs(math.log(0.7))) / 5))
    assert_close(metrics["kl_cov_frac"], torch.tensor(1 / 5))
    loss.backward()
    assert_close(log_prob.grad, t([[-2.2, -1.8, -2.1], [0.7 - 1.0, 0.95, 0.0]]) / 5)
