"""ReMax, OPO, GPG and pass@k advantages against numbers worked out by hand.

The batch has groups of different sizes (3, 3, 2 and a singleton), interleaved and with non-contiguous
ids, and responses of different lengths padded to width 3 with junk rewards in the padding.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import compares_group_samples, compute_advantage, gpg, opo, pass_at_k, remax

EPS = 1e-6


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def per_token(per_seq, mask):
    return t([[a * m for m in row] for a, row in zip(per_seq, mask.tolist(), strict=True)])


# Rows 0..8: lengths 2, 3, 1, 3, 2, 1, 3, 1, 2.
MASK = t(
    [
        [1, 1, 0],
        [1, 1, 1],
        [1, 0, 0],
        [1, 1, 1],
        [1, 1, 0],
        [1, 0, 0],
        [1, 1, 1],
        [1, 0, 0],
        [1, 1, 0],
    ]
)
# Group 5 = rows 0, 1, 2; group 2 = rows 3, 4, 6; group 9 = row 5 (singleton); group 4 = rows 7, 8 (equal).
GROUPS = torch.tensor([5, 5, 5, 2, 2, 9, 2, 4, 4])
SCORES = t([1.0, 0.0, 1.0, 0.5, 2.0, 3.0, 1.0, 1.0, 1.0])


def token_rewards_with_padding_junk():
    """``SCORES`` as outcome rewards at each row's last valid token, 100 at every padded position."""
    rewards = torch.where(MASK.bool(), torch.zeros_like(MASK), torch.full_like(MASK, 100.0))
    last = MASK.sum(dim=-1).long() - 1
    rewards[torch.arange(len(SCORES)), last] = SCORES
    return rewards


# --------------------------------------------------------------------------------------------- ReMax


def test_remax_subtracts_the_greedy_score():
    baseline = t([0.5, 0.5, 0.5, 1.0, 1.0, 4.0, 1.0, 2.0, 2.0])
    expected = [1 - 0.5, 0 - 0.5, 1 - 0.5, 0.5 - 1, 2 - 1, 3 - 4, 1 - 1, 1 - 2, 1 - 2]
    adv, ret = remax({"scores": SCORES, "baseline_scores": baseline, "response_mask": MASK})
    assert_close(adv, per_token(expected, MASK))
    assert_close(ret, adv)
    # Same from token rewards (junk in the padding must not count), by name.
    data = {"token_level_rewards": token_rewards_with_padding_junk(), "baseline_scores": baseline}
    adv, _ = compute_advantage({**data, "response_mask": MASK}, "remax")
    assert_close(adv, per_token(expected, MASK))


def test_remax_needs_the_baseline_column():
    with pytest.raises(KeyError, match="'baseline_scores'"):
        remax({"scores": SCORES, "response_mask": MASK})
    with pytest.raises(ValueError, match="baseline_scores must be"):
        remax({"scores": SCORES, "baseline_scores": t([1.0, 2.0]), "response_mask": MASK})


def test_remax_needs_no_group_but_the_others_do():
    assert not compares_group_samples("remax")
    assert compares_group_samples("opo")
    assert compares_group_samples("gpg")
    assert compares_group_samples("pass_at_k")


# --------------------------------------------------------------------------------------------- OPO


def test_opo_uses_the_length_weighted_group_baseline():
    # Group 5: lengths 2, 3, 1; scores 1, 0, 1 -> b = (2*1 + 3*0 + 1*1) / 6 = 0.5 (the plain mean is 2/3).
    b5 = (2 * 1 + 3 * 0 + 1 * 1) / (2 + 3 + 1)
    # Group 2 (rows 3, 4, 6): lengths 3, 2, 3; scores 0.5, 2, 1 -> b = (1.5 + 4 + 3) / 8 = 1.0625.
    b2 = (3 * 0.5 + 2 * 2.0 + 3 * 1.0) / (3 + 2 + 3)
    # Group 4: equal scores -> b = 1, A = 0. Group 9: singleton -> 0.
    expected = [1 - b5, 0 - b5, 1 - b5, 0.5 - b2, 2 - b2, 0.0, 1 - b2, 0.0, 0.0]
    adv, ret = opo({"scores": SCORES, "response_mask": MASK, "group_ids": GROUPS})
    assert_close(adv, per_token(expected, MASK))
    assert_close(ret, adv)
    adv, _ = compute_advantage(
        {
            "token_level_rewards": token_rewards_with_padding_junk(),
            "response_mask": MASK,
            "group_ids": GROUPS,
        },
        "opo",
    )
    assert_close(adv, per_token(expected, MASK))


def test_opo_with_equal_lengths_is_the_group_mean_baseline():
    mask = torch.ones(4, 2)
    scores = t([1.0, 0.0, 3.0, 5.0])
    adv, _ = opo({"scores": scores, "response_mask": mask, "group_ids": torch.tensor([0, 0, 1, 1])})
    assert_close(adv, per_token([0.5, -0.5, -1.0, 1.0], mask))


# --------------------------------------------------------------------------------------------- GPG


def test_gpg_centres_without_std_and_rescales_by_valid_share():
    # Centred scores: group 5 mean 2/3; group 2 mean (0.5 + 2 + 1) / 3 = 7/6; group 9 and group 4 -> 0.
    centred = [1 - 2 / 3, 0 - 2 / 3, 1 - 2 / 3, 0.5 - 7 / 6, 2 - 7 / 6, 0.0, 1 - 7 / 6, 0.0, 0.0]
    # B = 9 rows with tokens, M = 3 with zero advantage (rows 5, 7, 8): alpha = 9 / 6.
    alpha = 9 / (9 - 3)
    adv, ret = gpg({"scores": SCORES, "response_mask": MASK, "group_ids": GROUPS})
    assert_close(adv, per_token([alpha * c for c in centred], MASK))
    assert_close(ret, adv)


def test_gpg_counts_only_rows_with_tokens():
    # Row 2 has no valid token (and its own group): B = 2, M = 0, so alpha = 1 (3/2 if it were counted).
    mask = t([[1, 1], [1, 0], [0, 0]])
    adv, _ = gpg({"scores": t([1.0, 0.0, 0.0]), "response_mask": mask, "group_ids": torch.tensor([0, 0, 1])})
    assert_close(adv, t([[0.5, 0.5], [-0.5, 0.0], [0.0, 0.0]]))


def test_gpg_with_no_valid_sample_is_zero():
    adv, _ = gpg(
        {"scores": t([1.0, 1.0]), "response_mask": torch.ones(2, 2), "group_ids": torch.tensor([3, 3])}
    )
    assert_close(adv, torch.zeros(2, 2))


# --------------------------------------------------------------------------------------------- pass@k

# Group 3 (rows 0, 4, 7, 8): [1, 0, 0, 0]; group 6 (rows 1, 2, 5): [1, 1, 0];
# group 1 (rows 3, 6, 9, 10, 11): [0, 1, 0, 0, 1]; group 8 (rows 12, 13): [0, 0].
PK_GROUPS = torch.tensor([3, 6, 6, 1, 3, 6, 1, 3, 3, 1, 1, 1, 8, 8])
PK_SCORES = t([1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0])
PK_LENGTHS = [3, 1, 2, 3, 1, 3, 2, 1, 3, 2, 1, 3, 2, 1]
PK_MASK = t([[1 if j < n else 0 for j in range(3)] for n in PK_LENGTHS])


def pk_data():
    return {"scores": PK_SCORES, "response_mask": PK_MASK, "group_ids": PK_GROUPS}


def test_pass_at_2_by_hand():
    # Group 3: N = 4, N_neg = 3. R = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5, sigma = sqrt(0.25) = 0.5.
    # A_pos = 0.5 / 0.5; A_neg = (1 - 0.5 - C(2,1)/C(3,1)) / 0.5 = (0.5 - 2/3) / 0.5.
    g3_pos, g3_neg = 0.5 / (0.5 + EPS), (0.5 - 2 / 3) / (0.5 + EPS)
    # Group 6: N = 3, N_neg = 1. C(1,2) = 0, so R = 1, sigma = 0: every pair passes, A = 0 for all.
    # Group 1: N = 5, N_neg = 3. R = 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7, sigma = sqrt(0.7 * 0.3).
    # A_pos = 0.3 / sigma; A_neg = (0.3 - C(2,1)/C(4,1)) / sigma = (0.3 - 0.5) / sigma.
    s1 = math.sqrt(0.7 * 0.3)
    g1_pos, g1_neg = 0.3 / (s1 + EPS), (0.3 - 0.5) / (s1 + EPS)
    # Group 8: all wrong -> R = 0, A_neg = (1 - 0 - C(1,1)/C(1,1)) / eps = 0.
    expected = [
        g3_pos,
        0.0,
        0.0,
        g1_neg,
        g3_neg,
        0.0,
        g1_pos,
        g3_neg,
        g3_neg,
        g1_neg,
        g1_neg,
        g1_pos,
        0.0,
        0.0,
    ]
    adv, ret = pass_at_k(pk_data(), k=2)
    assert_close(adv, per_token(expected, PK_MASK))
    assert_close(ret, adv)


def test_pass_at_3_by_hand():
    # Group 1 only (N = 5, N_neg = 3): R = 1 - C(3,3)/C(5,3) = 0.9, sigma = sqrt(0.09) = 0.3;
    # A_neg = (0.1 - C(2,2)/C(4,2)) / 0.3 = (0.1 - 1/6) / 0.3.
    data = {key: value[[3, 6, 9, 10, 11]] for key, value in pk_data().items()}
    pos, neg = 0.1 / (0.3 + EPS), (0.1 - 1 / 6) / (0.3 + EPS)
    adv, _ = compute_advantage(data, "pass_at_k", k=3)
    assert_close(adv, per_token([neg, pos, neg, neg, pos], data["response_mask"]))


def test_pass_at_1_is_grpo_with_population_std():
    # k = 1: R = accuracy p, A_pos = (1 - p)/sigma, A_neg = -p/sigma with sigma = sqrt(p (1 - p)).
    # Group 3: p = 1/4; group 6: p = 2/3; group 1: p = 2/5; group 8: p = 0 -> 0.
    def pos_neg(p):
        sigma = math.sqrt(p * (1 - p))
        return (1 - p) / (sigma + EPS), -p / (sigma + EPS)

    (p3, n3), (p6, n6), (p1, n1) = pos_neg(1 / 4), pos_neg(2 / 3), pos_neg(2 / 5)
    expected = [p3, p6, p6, n1, n3, n6, p1, n3, n3, n1, n1, p1, 0.0, 0.0]
    adv, _ = pass_at_k(pk_data(), k=1)
    assert_close(adv, per_token(expected, PK_MASK))


def test_pass_at_k_rejects_non_binary_scores_and_small_groups():
    with pytest.raises(ValueError, match=r"row 4 has score 0\.5"):
        pass_at_k({**pk_data(), "scores": PK_SCORES.index_fill(0, torch.tensor([4]), 0.5)}, k=2)
    # Group 8 has 2 samples; its first row is 12.
    with pytest.raises(ValueError, match="k=3 exceeds the size 2 of the group of row 12"):
        pass_at_k(pk_data(), k=3)
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        pass_at_k(pk_data(), k=0)
    with pytest.raises(TypeError, match="unexpected parameter"):
        compute_advantage(pk_data(), "pass_at_k", k=2, norm_by_std=True)
