"""Policy losses against numbers worked out by hand, values and gradients."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import compute_policy_loss, gspo_loss, ppo_clip_loss, reinforce_loss


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def logs(ratios):
    return [math.log(r) for r in ratios]


def k3(ratios):
    return sum(r - 1 - math.log(r) for r in ratios) / len(ratios)


# Four valid tokens and one masked one; old log-probs 0 so log_prob = log(ratio).
# a: A=+1, r=1.5 -> max(-1.5, -1.2) = -1.2 (clipped)
# b: A=+1, r=0.5 -> max(-0.5, -0.8) = -0.5
# c: A=-1, r=0.5 -> max(0.5, 0.8)   = 0.8  (clipped)
# d: A=-1, r=4.0 -> max(4.0, 1.2)   = 4.0  (dual clip c=3 -> 3.0)
RATIOS = [1.5, 0.5, 0.5, 4.0, 50.0]
ADV = t([[1.0, 1.0, -1.0, -1.0, -1.0]])
MASK = t([[1, 1, 1, 1, 0]])
OLD = torch.zeros(1, 5)


def leaf(values):
    return t([values]).requires_grad_(True)


def test_ppo_clip_by_hand():
    log_prob = leaf(logs(RATIOS))
    loss, metrics = ppo_clip_loss(log_prob, OLD, ADV, MASK, clip_eps_low=0.2)
    assert_close(loss, torch.tensor((-1.2 - 0.5 + 0.8 + 4.0) / 4))
    assert_close(metrics["clip_frac"], torch.tensor(2 / 4))
    assert_close(metrics["dual_clip_frac"], torch.tensor(0.0))
    assert_close(metrics["approx_kl"], torch.tensor(k3(RATIOS[:4])))
    loss.backward()
    # d(-A r)/d log_prob = -A r where unclipped, 0 where clipped; divided by 4 tokens.
    assert_close(log_prob.grad, t([[0.0, -0.5 / 4, 0.0, 4.0 / 4, 0.0]]))


def test_ppo_dual_clip_bounds_negative_advantage():
    log_prob = leaf(logs(RATIOS))
    loss, metrics = ppo_clip_loss(log_prob, OLD, ADV, MASK, clip_eps_low=0.2, dual_clip_c=3.0)
    assert_close(loss, torch.tensor((-1.2 - 0.5 + 0.8 + 3.0) / 4))
    assert_close(metrics["dual_clip_frac"], torch.tensor(1 / 4))
    loss.backward()
    assert_close(log_prob.grad, t([[0.0, -0.5 / 4, 0.0, 0.0, 0.0]]))


def test_ppo_dual_clip_does_not_touch_positive_advantages():
    # A=+1 with r=10: plain clip gives -1.2 and dual clip must not apply (it is for A < 0 only).
    loss, metrics = ppo_clip_loss(t([[math.log(10.0)]]), t([[0.0]]), t([[1.0]]), t([[1]]), dual_clip_c=3.0)
    assert_close(loss, torch.tensor(-1.2))
    assert_close(metrics["dual_clip_frac"], torch.tensor(0.0))


def test_ppo_clip_higher():
    # e: A=+1, r=1.25; f: A=-1, r=0.7.
    log_prob = t([logs([1.25, 0.7])])
    adv, mask, old = t([[1.0, -1.0]]), t([[1, 1]]), torch.zeros(1, 2)
    # Asymmetric (0.2, 0.28): e stays unclipped (-1.25); f is clipped at 0.8 -> 0.8.
    loss, metrics = ppo_clip_loss(log_prob, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    assert_close(loss, torch.tensor((-1.25 + 0.8) / 2))
    assert_close(metrics["clip_frac"], torch.tensor(1 / 2))
    # Symmetric 0.2: e is clipped at 1.2 -> -1.2.
    loss, metrics = ppo_clip_loss(log_prob, old, adv, mask, clip_eps_low=0.2)
    assert_close(loss, torch.tensor((-1.2 + 0.8) / 2))
    assert_close(metrics["clip_frac"], torch.tensor(1.0))


def test_ppo_aggregation_mode_is_applied():
    # Row 0 tokens [a, b], row 1 token [c]: seq-mean-token-mean = ((-1.2 - 0.5)/2 + 0.8) / 2.
    log_prob = t([logs([1.5, 0.5]), logs([0.5, 1.0])])
    adv = t([[1.0, 1.0], [-1.0, 5.0]])
    mask = t([[1, 1], [1, 0]])
    loss, _ = ppo_clip_loss(log_prob, torch.zeros(2, 2), adv, mask, loss_agg_mode="seq-mean-token-mean")
    assert_close(loss, torch.tensor(((-1.2 - 0.5) / 2 + 0.8) / 2))


def test_ppo_rejects_bad_dual_clip():
    with pytest.raises(ValueError, match="dual_clip_c"):
        ppo_clip_loss(t([[0.0]]), t([[0.0]]), t([[1.0]]), t([[1]]), dual_clip_c=0.5)


def test_gspo_uses_sequence_ratio():
    # Row 0 (A=+1): token log-ratios 0.1 and 0.3 (0.2 masked junk 5.0) -> s = exp(0.2) = 1.2214 > 1.2:
    # clipped, each token -1.2. A token-level ratio would clip only the second token.
    # Row 1 (A=-2): log-ratios -0.1, 0, 0.1 -> s = 1: each token 2.0.
    log_prob = t([[0.1, 0.3, 5.0], [-0.1, 0.0, 0.1]]).requires_grad_(True)
    old = torch.zeros(2, 3)
    adv = t([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    loss, metrics = gspo_loss(log_prob, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2)
    assert_close(loss, torch.tensor((-1.2 + 2.0) / 2))  # seq-mean-token-mean
    assert_close(metrics["clip_frac"], torch.tensor(2 / 5))
    token_ratios = [math.exp(x) for x in (0.1, 0.3, -0.1, 0.0, 0.1)]
    assert_close(metrics["approx_kl"], torch.tensor(k3(token_ratios)))
    loss.backward()
    # Row 1: d(-A s)/d log_prob_t = -A s = 2 per token, weighted 1/(2 seqs * 3 tokens). Row 0 clipped.
    assert_close(log_prob.grad, t([[0.0, 0.0, 0.0], [2 / 6, 2 / 6, 2 / 6]]))


def test_gspo_default_clip_range():
    # s = 1.0005 exceeds the default 1 + 4e-4 for A>0: loss = -1.0004. Below 1 - 3e-4 for A<0 too.
    loss, metrics = gspo_loss(t([[math.log(1.0005)]]), t([[0.0]]), t([[1.0]]), t([[1]]))
    assert_close(loss, torch.tensor(-1.0004))
    assert_close(metrics["clip_frac"], torch.tensor(1.0))
    loss, _ = gspo_loss(t([[math.log(0.9995)]]), t([[0.0]]), t([[-1.0]]), t([[1]]))
    assert_close(loss, torch.tensor(1.0 - 3e-4))


def test_reinforce_truncated_importance_weights():
    # r = [2, 0.5, 1], A = [1, -1, 2]; truncation at 1.5 -> w = [1.5, 0.5, 1].
    log_prob = leaf(logs([2.0, 0.5, 1.0]))
    adv = t([[1.0, -1.0, 2.0]])
    mask = t([[1, 1, 1]])
    loss, metrics = reinforce_loss(log_prob, torch.zeros(1, 3), adv, mask, max_importance_weight=1.5)
    assert_close(loss, torch.tensor((-1.5 + 0.5 - 2.0) / 3))
    assert_close(metrics["clip_frac"], torch.tensor(1 / 3))
    loss.backward()
    # Gradient -A w / N: the weight carries no gradient.
    assert_close(log_prob.grad, t([[-1.5 / 3, 0.5 / 3, -2.0 / 3]]))


def test_reinforce_untruncated_and_on_policy():
    log_prob = leaf(logs([2.0, 0.5, 1.0]))
    adv = t([[1.0, -1.0, 2.0]])
    mask = t([[1, 1, 0]])
    loss, metrics = compute_policy_loss("reinforce", log_prob, torch.zeros(1, 3), adv, mask)
    assert_close(loss, torch.tensor((-2.0 + 0.5) / 2))
    assert_close(metrics["clip_frac"], torch.tensor(0.0))
    loss.backward()
    assert_close(log_prob.grad, t([[-2.0 / 2, 0.5 / 2, 0.0]]))

    # On-policy: the loss is -mean(A) and the gradient -A / N.
    lp = t([[-0.3, -1.7]]).requires_grad_(True)
    loss, metrics = reinforce_loss(lp, lp.detach().clone(), t([[1.0, 3.0]]), t([[1, 1]]))
    assert_close(loss, torch.tensor(-2.0))
    assert_close(metrics["approx_kl"], torch.tensor(0.0))
    loss.backward()
    assert_close(lp.grad, t([[-0.5, -1.5]]))


def test_policy_loss_shape_mismatch():
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2, 3))


def test_extreme_log_ratio_stays_finite():
    loss, metrics = ppo_clip_loss(t([[0.0]]), t([[-1000.0]]), t([[-1.0]]), t([[1]]))
    assert torch.isfinite(loss)
    assert torch.isfinite(metrics["approx_kl"])
