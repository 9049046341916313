"""Advantage estimators against numbers worked out by hand."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import (
    compute_advantage,
    discounted_returns,
    gae,
    grpo,
    reinforce_pp,
    reinforce_pp_baseline,
    rloo,
)

EPS_GRPO = 1e-6
EPS_WHITEN = 1e-8


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def whiten_by_hand(xs):
    """(x - mean) / sqrt(var + eps) with the Bessel-corrected variance, over a list of valid values."""
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return [(x - mean) / math.sqrt(var + EPS_WHITEN) for x in xs]


# Four samples: rewards [1, 0, 1] in group 0 and [0.5] in group 1, responses of lengths 2, 3, 1, 2.
MASK = t([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
GROUPS = torch.tensor([0, 0, 0, 1])
SCORES = t([1.0, 0.0, 1.0, 0.5])


def per_token(per_seq, mask=MASK):
    return t([[a * m for m in row] for a, row in zip(per_seq, mask.tolist(), strict=True)])


# --------------------------------------------------------------------------------------------- GRPO


def test_grpo_by_hand_with_unequal_groups_and_singleton():
    mean0 = (1 + 0 + 1) / 3
    std0 = math.sqrt(((1 - mean0) ** 2 + (0 - mean0) ** 2 + (1 - mean0) ** 2) / (3 - 1))  # sqrt(1/3)
    expected = [
        (1 - mean0) / (std0 + EPS_GRPO),  # +0.57735
        (0 - mean0) / (std0 + EPS_GRPO),  # -1.15470
        (1 - mean0) / (std0 + EPS_GRPO),
        0.0,  # group of size 1
    ]
    adv, ret = grpo({"scores": SCORES, "response_mask": MASK, "group_ids": GROUPS})
    assert_close(adv, per_token(expected))
    assert_close(ret, adv)


def test_dr_grpo_does_not_divide_by_std():
    adv, _ = grpo({"scores": SCORES, "response_mask": MASK, "group_ids": GROUPS}, norm_by_std=False)
    assert_close(adv, per_token([1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3, 0.0]))


def test_grpo_reads_scores_from_token_rewards_and_ignores_padding():
    # Same scores, given as token rewards at the last valid token; junk (100) sits at padded positions.
    token_rewards = t([[0, 1, 100], [0, 0, 0], [1, 100, 100], [0.25, 0.25, 100]])
    adv, _ = compute_advantage(
        {"token_level_rewards": token_rewards, "response_mask": MASK, "group_ids": GROUPS},
        "grpo",
        norm_by_std=False,
    )
    assert_close(adv, per_token([1 / 3, -2 / 3, 1 / 3, 0.0]))


def test_grpo_non_contiguous_ids_and_equal_scores():
    # Group 7 = samples 0, 2, 4 (scores 2, 2, 2: zero std -> advantage 0, not nan); group 3 = samples 1, 3.
    scores = t([2.0, 1.0, 2.0, 3.0, 2.0])
    ids = torch.tensor([7, 3, 7, 3, 7])
    mask = torch.ones(5, 1)
    std3 = math.sqrt(((1 - 2) ** 2 + (3 - 2) ** 2) / 1)  # sqrt(2)
    adv, _ = grpo({"scores": scores, "response_mask": mask, "group_ids": ids})
    assert_close(adv, t([[0.0], [-1 / (std3 + EPS_GRPO)], [0.0], [1 / (std3 + EPS_GRPO)], [0.0]]))


# --------------------------------------------------------------------------------------------- two-level

# Rows: (query, prefix) = (0,0), (0,0), (0,1), (0,1), (1,0), (1,0). Prefix 0 of query 1 is a different
# group from prefix 0 of query 0.
TWO_LEVEL = torch.tensor([[0, 0], [0, 0], [0, 1], [0, 1], [1, 0], [1, 0]])
TWO_LEVEL_SCORES = t([1.0, 0.0, 1.0, 1.0, 0.0, 3.0])
ONES6 = torch.ones(6, 1)


def test_two_level_grouping_uses_finest_group():
    data = {"scores": TWO_LEVEL_SCORES, "response_mask": ONES6, "group_ids": TWO_LEVEL}
    # (0,0): mean 0.5 -> +-0.5; (0,1): equal -> 0; (1,0): mean 1.5 -> -1.5, +1.5.
    adv, _ = grpo(data, norm_by_std=False)
    assert_close(adv, t([[0.5], [-0.5], [0.0], [0.0], [-1.5], [1.5]]))

    # With std: (0,0) std sqrt(0.5); (1,0) std sqrt(4.5).
    adv, _ = grpo(data)
    s00, s10 = math.sqrt(0.5), math.sqrt(4.5)
    expected = [
        0.5 / (s00 + EPS_GRPO),
        -0.5 / (s00 + EPS_GRPO),
        0.0,
        0.0,
        -1.5 / (s10 + EPS_GRPO),
        1.5 / (s10 + EPS_GRPO),
    ]
    assert_close(adv, t([[e] for e in expected]))

    # RLOO on the same groups: 1 - 0 = 1, 0 - 1 = -1, ..., 0 - 3 = -3, 3 - 0 = 3.
    adv, _ = rloo(data)
    assert_close(adv, t([[1.0], [-1.0], [0.0], [0.0], [-3.0], [3.0]]))


def test_query_level_grouping_from_first_column():
    data = {"scores": TWO_LEVEL_SCORES, "response_mask": ONES6, "group_ids": TWO_LEVEL[:, 0]}
    # Query 0: [1, 0, 1, 1], mean 0.75; query 1: [0, 3], mean 1.5.
    adv, _ = grpo(data, norm_by_std=False)
    assert_close(adv, t([[0.25], [-0.75], [0.25], [0.25], [-1.5], [1.5]]))


def test_group_ids_must_be_integer():
    with pytest.raises(TypeError, match="integer"):
        grpo({"scores": SCORES, "response_mask": MASK, "group_ids": GROUPS.float()})


# --------------------------------------------------------------------------------------------- RLOO


def test_rloo_by_hand():
    # Group 0 [1, 0, 1]; group 1 [0.5] (singleton -> 0); group 2 [2, 4].
    scores = t([1.0, 0.0, 1.0, 0.5, 2.0, 4.0])
    ids = torch.tensor([0, 0, 0, 1, 2, 2])
    mask = t([[1, 1], [1, 0], [1, 1], [1, 1], [1, 0], [1, 1]])
    expected = [
        1 - (0 + 1) / 2,  # 0.5
        0 - (1 + 1) / 2,  # -1
        1 - (1 + 0) / 2,  # 0.5
        0.0,
        2 - 4,
        4 - 2,
    ]
    adv, ret = rloo({"scores": scores, "response_mask": mask, "group_ids": ids})
    assert_close(adv, per_token(expected, mask))
    assert_close(ret, adv)


# --------------------------------------------------------------------------------------------- GAE


def test_gae_by_hand_without_whitening():
    gamma, lam = 0.9, 0.8
    rewards = t([[0, 0, 1], [0, 2, 9]])  # 9 is padding junk
    values = t([[0.5, 0.6, 0.7], [1.0, 0.5, 5.0]])  # 5.0 is padding junk
    mask = t([[1, 1, 1], [1, 1, 0]])
    # Row 0.
    a02 = 1 + gamma * 0 - 0.7  # 0.3
    a01 = (0 + gamma * 0.7 - 0.6) + gamma * lam * a02  # 0.03 + 0.216 = 0.246
    a00 = (0 + gamma * 0.6 - 0.5) + gamma * lam * a01  # 0.04 + 0.17712 = 0.21712
    # Row 1 ends at t=1.
    a11 = 2 + gamma * 0 - 0.5  # 1.5
    a10 = (0 + gamma * 0.5 - 1.0) + gamma * lam * a11  # -0.55 + 1.08 = 0.53
    adv, ret = gae(
        {"token_level_rewards": rewards, "values": values, "response_mask": mask},
        gamma=gamma,
        lam=lam,
        whiten=False,
    )
    assert_close(adv, t([[a00, a01, a02], [a10, a11, 0.0]]))
    assert_close(ret, t([[a00 + 0.5, a01 + 0.6, a02 + 0.7], [a10 + 1.0, a11 + 0.5, 0.0]]))

    # Whitening over the 5 valid tokens changes advantages only; returns stay as above.
    adv_w, ret_w = gae(
        {"token_level_rewards": rewards, "values": values, "response_mask": mask}, gamma=gamma, lam=lam
    )
    w = whiten_by_hand([a00, a01, a02, a10, a11])
    assert_close(adv_w, t([[w[0], w[1], w[2]], [w[3], w[4], 0.0]]))
    assert_close(ret_w, ret)


def test_gae_skips_masked_positions_inside_a_response():
    gamma, lam = 0.9, 0.8
    # Middle token is e.g. tool output: its reward (7) and value (9) must not matter.
    data = {
        "token_level_rewards": t([[0, 7, 1]]),
        "values": t([[0.5, 9, 0.7]]),
        "response_mask": t([[1, 0, 1]]),
    }
    a2 = 1 - 0.7
    a0 = (0 + gamma * 0.7 - 0.5) + gamma * lam * a2  # 0.13 + 0.216 = 0.346
    adv, _ = gae(data, gamma=gamma, lam=lam, whiten=False)
    assert_close(adv, t([[a0, 0.0, a2]]))


def test_gae_lam_one_gamma_one_is_return_minus_value():
    data = {
        "token_level_rewards": t([[1, 2, 3]]),
        "values": t([[0.5, 1.0, 1.5]]),
        "response_mask": t([[1, 1, 1]]),
    }
    adv, ret = gae(data, whiten=False)
    assert_close(ret, t([[6.0, 5.0, 3.0]]))
    assert_close(adv, t([[5.5, 4.0, 1.5]]))


# --------------------------------------------------------------------------------------------- returns


def test_discounted_returns_by_hand():
    rewards = t([[1, 2, 3]])
    mask = t([[1, 0, 1]])
    # The masked token's reward is ignored and takes no discount step: G2 = 3, G0 = 1 + 0.5 * 3.
    assert_close(discounted_returns(rewards, mask, gamma=0.5), t([[2.5, 0.0, 3.0]]))
    assert_close(discounted_returns(rewards, mask, gamma=1.0), t([[4.0, 0.0, 3.0]]))
    full = t([[1, 1, 1]])
    assert_close(
        discounted_returns(rewards, full, gamma=0.5), t([[1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0]])
    )


# --------------------------------------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_with_kl_in_reward():
    mask = t([[1, 1, 1], [1, 1, 0]])
    kl = t([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])  # 9.0 is padding junk
    coef = 0.5
    # Token rewards: score at the last valid token minus 0.5 * kl.
    r0 = [-coef * 0.1, -coef * 0.2, 1.0 - coef * 0.3]  # [-0.05, -0.1, 0.85]
    r1 = [-coef * 0.4, 0.0 - coef * 0.5]  # [-0.2, -0.25]
    g0 = [r0[0] + r0[1] + r0[2], r0[1] + r0[2], r0[2]]  # [0.7, 0.75, 0.85]
    g1 = [r1[0] + r1[1], r1[1]]  # [-0.45, -0.25]
    adv, ret = reinforce_pp({"scores": t([1.0, 0.0]), "response_mask": mask, "kl": kl}, kl_coef=coef)
    assert_close(ret, t([g0, [*g1, 0.0]]))
    w = whiten_by_hand(g0 + g1)
    assert_close(adv, t([w[:3], [*w[3:], 0.0]]))


def test_reinforce_pp_discount_and_token_rewards():
    mask = t([[1, 1, 1], [1, 0, 1]])
    # From scores with gamma 0.5 (row 1 has a masked middle token).
    g0 = [0.25 * 1.0, 0.5 * 1.0, 1.0]
    g1 = [0.5 * 2.0, 0.0, 2.0]
    adv, ret = reinforce_pp({"scores": t([1.0, 2.0]), "response_mask": mask}, gamma=0.5)
    assert_close(ret, t([g0, g1]))
    w = whiten_by_hand([*g0, g1[0], g1[2]])
    assert_close(adv, t([w[:3], [w[3], 0.0, w[4]]]))

    # From token rewards (a process reward at t=0 of row 0), gamma 1.
    _, ret = reinforce_pp({"token_level_rewards": t([[0.5, 0, 1], [0, 0, 2]]), "response_mask": mask})
    assert_close(ret, t([[1.5, 1.0, 1.0], [2.0, 0.0, 2.0]]))


def test_reinforce_pp_needs_kl_when_coef_set():
    with pytest.raises(KeyError, match="'kl'"):
        reinforce_pp({"scores": t([1.0]), "response_mask": t([[1]])}, kl_coef=0.1)


def test_reinforce_pp_baseline_by_hand():
    mask = t([[1, 1], [1, 1], [1, 0], [1, 1]])
    # Group 0 scores [1, 0, 1] (mean 2/3) -> [1/3, -2/3, 1/3]; group 1 [0.5] -> 0. Gamma 1: every valid
    # token's return is the baselined score.
    b = [1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3, 0.0]
    adv, ret = reinforce_pp_baseline({"scores": SCORES, "response_mask": mask, "group_ids": GROUPS})
    assert_close(ret, t([[b[0], b[0]], [b[1], b[1]], [b[2], 0.0], [b[3], b[3]]]))
    w = whiten_by_hand([b[0], b[0], b[1], b[1], b[2], b[3], b[3]])
    assert_close(adv, t([[w[0], w[1]], [w[2], w[3]], [w[4], 0.0], [w[5], w[6]]]))


def test_reinforce_pp_baseline_with_kl():
    mask = t([[1, 1], [1, 1]])
    kl = t([[0.2, 0.4], [0.0, 0.2]])
    # Scores [1, 0] in one group: baselined [0.5, -0.5] at the last token, minus 1.0 * kl per token.
    r0 = [-0.2, 0.5 - 0.4]
    r1 = [0.0, -0.5 - 0.2]
    _, ret = reinforce_pp_baseline(
        {"scores": t([1.0, 0.0]), "response_mask": mask, "group_ids": torch.tensor([4, 4]), "kl": kl},
        kl_coef=1.0,
    )
    assert_close(ret, t([[r0[0] + r0[1], r0[1]], [r1[0] + r1[1], r1[1]]]))


def test_shape_mismatch_is_reported():
    with pytest.raises(ValueError, match="scores"):
        grpo({"scores": t([1.0, 2.0, 3.0]), "response_mask": MASK, "group_ids": GROUPS})


def test_token_rewards_take_precedence_over_scores():
    # Scores say 1 but the token rewards (shaped, or KL-penalised) sum to 5: dropping them would lose the
    # penalty, so the token rewards are used, by token-level and by outcome estimators alike.
    data = {"scores": t([1.0]), "token_level_rewards": t([[2.0, 3.0]]), "response_mask": t([[1, 1]])}
    _, ret = reinforce_pp(data)
    assert_close(ret, t([[5.0, 3.0]]))
    groups = {**data, "scores": t([1.0, 1.0]), "token_level_rewards": t([[2.0, 3.0], [0.0, 1.0]]),
              "response_mask": t([[1, 1], [1, 1]]), "group_ids": torch.tensor([0, 0])}
    adv, _ = grpo(groups, norm_by_std=False)
    assert_close(adv, t([[2.0, 2.0], [-2.0, -2.0]]))
