"""CISPO, SAPO and GMPO losses against numbers worked out by hand: values, gradients and metrics.

Each batch has rows of different lengths, with junk at the padded positions.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import cispo_loss, compute_policy_loss, gmpo_loss, sapo_loss


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def k3(ratios):
    return sum(r - 1 - math.log(r) for r in ratios) / len(ratios)


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


# --------------------------------------------------------------------------------------------- CISPO

# Row 0: a (pi_old 0.5 -> 0.75, r 1.5, A +1), b (0.8 -> 0.08, r 0.1, A -1), c (0.2 -> 1.0, r 5, A +2).
# Row 1: d (0.4 -> 0.36, r 0.9, A +0.5), then padding.
CISPO_OLD = t([[math.log(0.5), math.log(0.8), math.log(0.2)], [math.log(0.4), 0.0, 0.0]])
CISPO_NEW = [[math.log(0.75), math.log(0.08), 0.0], [math.log(0.36), 7.0, 7.0]]
CISPO_ADV = t([[1.0, -1.0, 2.0], [0.5, 9.0, 9.0]])
CISPO_MASK = t([[1, 1, 1], [1, 0, 0]])


def test_cispo_default_bounds_only_the_weight_from_above():
    log_prob = t(CISPO_NEW).requires_grad_(True)
    loss, metrics = cispo_loss(log_prob, CISPO_OLD, CISPO_ADV, CISPO_MASK)
    # Weights: no lower bound, capped at 1 + 3 = 4: [1.5, 0.1, 4 (from 5), 0.9].
    terms = [
        -1.0 * 1.5 * math.log(0.75),
        1.0 * 0.1 * math.log(0.08),
        -2.0 * 4.0 * 0.0,
        -0.5 * 0.9 * math.log(0.36),
    ]
    assert_close(loss, torch.tensor(sum(terms) / 4))
    assert_close(metrics["clip_frac"], torch.tensor(1 / 4))
    assert_close(metrics["approx_kl"], torch.tensor(k3([1.5, 0.1, 5.0, 0.9])))
    loss.backward()
    # Gradient -A w / N for every token, the clipped one included (PPO would drop c).
    assert_close(log_prob.grad, t([[-1.5 / 4, 0.1 / 4, -8.0 / 4], [-0.45 / 4, 0.0, 0.0]]))


def test_cispo_two_sided_clip():
    log_prob = t(CISPO_NEW).requires_grad_(True)
    loss, metrics = compute_policy_loss(
        "cispo", log_prob, CISPO_OLD, CISPO_ADV, CISPO_MASK, clip_eps_low=0.2, clip_eps_high=0.28
    )
    # Weights clip to [0.8, 1.28]: [1.28, 0.8, 1.28, 0.9]; three of four are clipped.
    terms = [
        -1.0 * 1.28 * math.log(0.75),
        1.0 * 0.8 * math.log(0.08),
        0.0,
        -0.5 * 0.9 * math.log(0.36),
    ]
    assert_close(loss, torch.tensor(sum(terms) / 4))
    assert_close(metrics["clip_frac"], torch.tensor(3 / 4))
    loss.backward()
    assert_close(log_prob.grad, t([[-1.28 / 4, 0.8 / 4, -2.56 / 4], [-0.45 / 4, 0.0, 0.0]]))


def test_cispo_validates_bounds():
    with pytest.raises(ValueError, match="cispo"):
        cispo_loss(t([[0.0]]), t([[0.0]]), t([[1.0]]), t([[1]]), clip_eps_low=1.5)


# --------------------------------------------------------------------------------------------- SAPO

# Row 0: a (r 1, A +1), b (r 1.5, A +1), c (r 0.5, A -2). Row 1: d (r 2, A -1), then padding.
SAPO_RATIOS = [[1.0, 1.5, 0.5], [2.0, 1.0, 1.0]]
SAPO_ADV = t([[1.0, 1.0, -2.0], [-1.0, 5.0, 5.0]])
SAPO_MASK = t([[1, 1, 1], [1, 0, 0]])


def test_sapo_soft_gate_by_hand():
    tau_pos, tau_neg = 1.0, 1.05
    log_prob = t([[math.log(r) for r in row] for row in SAPO_RATIOS]).requires_grad_(True)
    loss, metrics = sapo_loss(log_prob, torch.zeros(2, 3), SAPO_ADV, SAPO_MASK)
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau; l = -A f(r); tau_pos for A > 0, tau_neg for A < 0.
    p_a, p_b = sigmoid(tau_pos * 0.0), sigmoid(tau_pos * 0.5)
    p_c, p_d = sigmoid(tau_neg * -0.5), sigmoid(tau_neg * 1.0)
    l_a, l_b = -1.0 * p_a * 4 / tau_pos, -1.0 * p_b * 4 / tau_pos
    l_c, l_d = 2.0 * p_c * 4 / tau_neg, 1.0 * p_d * 4 / tau_neg
    # Default aggregation: seq-mean-token-mean over the 2 rows.
    assert_close(loss, torch.tensor(((l_a + l_b + l_c) / 3 + l_d) / 2))
    gates = [4 * p * (1 - p) for p in (p_a, p_b, p_c, p_d)]
    assert_close(metrics["soft_gate_weight"], torch.tensor(sum(gates) / 4))
    assert "clip_frac" not in metrics
    loss.backward()
    # dl/dlog_prob = -A * 4 p (1 - p) * r: 1 on-policy at a (the plain policy gradient -A).
    g_a = -1.0 * gates[0] * 1.0
    g_b = -1.0 * gates[1] * 1.5
    g_c = 2.0 * gates[2] * 0.5
    g_d = 1.0 * gates[3] * 2.0
    assert_close(log_prob.grad, t([[g_a / 6, g_b / 6, g_c / 6], [g_d / 2, 0.0, 0.0]]))
    assert_close(torch.tensor(g_a), torch.tensor(-1.0))


def test_sapo_temperatures_and_token_mean():
    log_prob = t([[math.log(r) for r in row] for row in SAPO_RATIOS])
    loss, _ = sapo_loss(
        log_prob, torch.zeros(2, 3), SAPO_ADV, SAPO_MASK, tau_pos=2.0, tau_neg=3.0, loss_agg_mode="token-mean"
    )
    terms = [
        -1.0 * sigmoid(0.0) * 4 / 2.0,
        -1.0 * sigmoid(2.0 * 0.5) * 4 / 2.0,
        2.0 * sigmoid(3.0 * -0.5) * 4 / 3.0,
        1.0 * sigmoid(3.0 * 1.0) * 4 / 3.0,
    ]
    assert_close(loss, torch.tensor(sum(terms) / 4))
    with pytest.raises(ValueError, match="temperatures"):
        sapo_loss(log_prob, torch.zeros(2, 3), SAPO_ADV, SAPO_MASK, tau_neg=0.0)


# --------------------------------------------------------------------------------------------- GMPO

# Token log-ratios d (old log-probs 0); 9.0 marks padding.
# Row 0 (A +1, 3 tokens): d = [0.1, 0.6, -0.5]; A >= 0 clips d above 0.4 only -> [0.1, 0.4, -0.5], mean 0.
# Row 1 (A -2, 2 tokens): d = [-0.6, 0.3]; A < 0 clips d below -0.4 only -> [-0.4, 0.3], mean -0.05.
# Row 2 (A +0.5, 1 token): d = [0.2] -> mean 0.2.
GMPO_D = [[0.1, 0.6, -0.5], [-0.6, 0.3, 9.0], [0.2, 9.0, 9.0]]
GMPO_ADV = t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0], [0.5, 0.5, 0.5]])
GMPO_MASK = t([[1, 1, 1], [1, 1, 0], [1, 0, 0]])


def test_gmpo_geometric_mean_with_log_space_clip():
    log_prob = t(GMPO_D).requires_grad_(True)
    loss, metrics = gmpo_loss(log_prob, torch.zeros(3, 3), GMPO_ADV, GMPO_MASK)
    rho = [math.exp(0.0), math.exp((-0.4 + 0.3) / 2), math.exp(0.2)]
    seq_losses = [-1.0 * rho[0], 2.0 * rho[1], -0.5 * rho[2]]
    # Default seq-mean-token-mean: one term -A_i rho_i per sequence.
    assert_close(loss, torch.tensor(sum(seq_losses) / 3))
    assert_close(metrics["clip_frac"], torch.tensor(2 / 6))
    ratios = [math.exp(x) for x in (0.1, 0.6, -0.5, -0.6, 0.3, 0.2)]
    assert_close(metrics["approx_kl"], torch.tensor(k3(ratios)))
    loss.backward()
    # d(-A rho_i)/d log_prob_t = -A rho_i / n_i for unclipped tokens, 0 for clipped; then / 3 sequences.
    expected = [
        [-1.0 * rho[0] / 3 / 3, 0.0, -1.0 * rho[0] / 3 / 3],
        [0.0, 2.0 * rho[1] / 2 / 3, 0.0],
        [-0.5 * rho[2] / 1 / 3, 0.0, 0.0],
    ]
    assert_close(log_prob.grad, t(expected))


def test_gmpo_token_mean_weights_sequences_by_length_and_clip_range():
    log_prob = t(GMPO_D)
    loss, _ = gmpo_loss(log_prob, torch.zeros(3, 3), GMPO_ADV, GMPO_MASK, loss_agg_mode="token-mean")
    rho = [1.0, math.exp(-0.05), math.exp(0.2)]
    assert_close(loss, torch.tensor((3 * -1.0 * rho[0] + 2 * 2.0 * rho[1] + 1 * -0.5 * rho[2]) / 6))
    # A wider range (0.7) clips nothing: rho_0 = exp(0.2 / 3), rho_1 = exp(-0.15).
    loss, metrics = gmpo_loss(log_prob, torch.zeros(3, 3), GMPO_ADV, GMPO_MASK, clip_eps_low=0.7)
    rho = [math.exp(0.2 / 3), math.exp(-0.15), math.exp(0.2)]
    assert_close(loss, torch.tensor((-1.0 * rho[0] + 2.0 * rho[1] - 0.5 * rho[2]) / 3))
    assert_close(metrics["clip_frac"], torch.tensor(0.0))
