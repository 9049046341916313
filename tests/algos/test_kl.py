"""KL estimators, the KL-in-reward penalty and the coefficient controllers."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    compute_kl,
    kl_k1,
    kl_k2,
    kl_k3,
)

LOGP = torch.tensor([[-1.0, -2.0]])
REF = torch.tensor([[-1.5, -1.0]])


def test_k1_k2_k3_by_hand():
    # log_prob - ref = [0.5, -1.0]; delta = ref - log_prob = [-0.5, 1.0].
    assert_close(kl_k1(LOGP, REF), torch.tensor([[0.5, -1.0]]))
    assert_close(kl_k2(LOGP, REF), torch.tensor([[0.5 * 0.25, 0.5 * 1.0]]))
    expected_k3 = [math.exp(-0.5) + 0.5 - 1, math.exp(1.0) - 1.0 - 1]  # [0.10653, 0.71828]
    assert_close(kl_k3(LOGP, REF), torch.tensor([expected_k3]))
    assert_close(compute_kl(LOGP, REF, "k3"), torch.tensor([expected_k3]))
    assert_close(compute_kl(LOGP, REF, "k1"), torch.tensor([[0.5, -1.0]]))


def test_k3_clamps():
    logp = torch.tensor([[0.0, 0.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[15.0, 30.0, -0.5]])
    kl = kl_k3(logp, ref)
    # exp(15) - 16 is far above 10 -> 10; delta 30 -> also 10; small values are untouched.
    assert_close(kl, torch.tensor([[10.0, 10.0, math.exp(-0.5) + 0.5 - 1]]))
    kl.sum().backward()
    # Clamped tokens pass no gradient; d/dlogp of exp(d) - d - 1 with d = ref - logp is 1 - exp(d).
    assert_close(logp.grad, torch.tensor([[0.0, 0.0, 1 - math.exp(-0.5)]]))

    unclamped = kl_k3(logp.detach(), ref, clamp=None)
    # delta 30 is clamped to 20 before exp, so the value is finite: exp(20) - 21.
    assert_close(unclamped, torch.tensor([[math.exp(15) - 16, math.exp(20) - 21, math.exp(-0.5) - 0.5]]))


def test_k1_and_k3_are_unbiased_k2_is_not():
    # Exact expectations under p: sum_x p(x) * estimator(log p(x), log q(x)), against KL(p || q).
    p = torch.tensor([0.9, 0.1])
    q = torch.tensor([0.1, 0.9])
    log9 = math.log(9.0)
    exact = 0.9 * log9 + 0.1 * -log9  # 0.8 ln 9 = 1.7578

    def expectation(estimator):
        return float((p * estimator(p.log(), q.log())).sum())

    assert expectation(kl_k1) == pytest.approx(exact, rel=1e-5)
    assert expectation(kl_k3) == pytest.approx(exact, rel=1e-5)
    # k2 is biased: E[0.5 * (ln 9)^2] = 2.4139.
    assert expectation(kl_k2) == pytest.approx(0.5 * log9**2, rel=1e-5)


def test_apply_kl_penalty_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    expected = torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]])
    assert_close(apply_kl_penalty(rewards, kl, 0.5, mask), expected)
    assert_close(apply_kl_penalty(rewards, kl, 0.5)[1, 2], torch.tensor(-0.3))


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(0.05)
    assert ctrl.update(current_kl=100.0, n_steps=256) == 0.05
    assert ctrl.value == 0.05


def test_adaptive_controller_by_hand():
    ctrl = AdaptiveKLController(init_coef=0.1, target_kl=6.0, horizon=10_000)
    # KL 9 vs target 6: error 0.5, clipped to 0.2 -> beta * (1 + 0.2 * 256 / 10000).
    beta = 0.1 * (1 + 0.2 * 256 / 10_000)
    assert ctrl.update(9.0, 256) == pytest.approx(beta)
    # KL 6.6: error 0.1 (inside the clip).
    beta *= 1 + 0.1 * 256 / 10_000
    assert ctrl.update(6.6, 256) == pytest.approx(beta)
    # KL 0: error -1 clipped to -0.2.
    beta *= 1 - 0.2 * 512 / 10_000
    assert ctrl.update(0.0, 512) == pytest.approx(beta)
    assert ctrl.value == pytest.approx(beta)


def test_controller_validation_and_factory():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, 0.0, 100)
    with pytest.raises(ValueError, match="horizon"):
        build_kl_controller("adaptive", 0.1, target_kl=6.0)
    with pytest.raises(ValueError, match=r"'pid'.*adaptive, fixed"):
        build_kl_controller("pid", 0.1)
    assert isinstance(build_kl_controller("fixed", 0.1), FixedKLController)
    ctrl = build_kl_controller("adaptive", 0.1, target_kl=6.0, horizon=100)
    assert isinstance(ctrl, AdaptiveKLController) and ctrl.horizon == 100.0
