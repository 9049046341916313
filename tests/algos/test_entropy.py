"""Entropy from logits and the entropy bonus."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import entropy_bonus, entropy_from_logits

# p = [1/2, 1/2] -> ln 2; p = [1/4, 3/4] -> -(1/4 ln 1/4 + 3/4 ln 3/4).
H_UNIFORM = math.log(2)
H_QUARTER = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))  # 0.5623
LOGITS = torch.tensor([[[0.0, 0.0], [0.0, math.log(3)], [5.0, 5.0]]])


def test_entropy_from_logits_by_hand():
    assert_close(entropy_from_logits(LOGITS), torch.tensor([[H_UNIFORM, H_QUARTER, H_UNIFORM]]))


def test_entropy_of_peaked_logits_is_finite_zero():
    h = entropy_from_logits(torch.tensor([[0.0, -1e4, -1e4]]))
    assert_close(h, torch.tensor([0.0]))


def test_entropy_bonus_from_logits_and_from_entropy():
    mask = torch.tensor([[1, 1, 0]])
    mean_h = (H_UNIFORM + H_QUARTER) / 2
    term, logged = entropy_bonus(mask, coef=0.01, logits=LOGITS)
    assert_close(term, torch.tensor(-0.01 * mean_h))
    assert_close(logged, torch.tensor(mean_h))

    entropy = torch.tensor([[H_UNIFORM, H_QUARTER, 99.0]], requires_grad=True)
    term, _ = entropy_bonus(mask, coef=0.01, entropy=entropy)
    assert_close(term, torch.tensor(-0.01 * mean_h))
    term.backward()
    assert_close(entropy.grad, torch.tensor([[-0.01 / 2, -0.01 / 2, 0.0]]))


def test_entropy_bonus_needs_exactly_one_input():
    with pytest.raises(ValueError, match="exactly one"):
        entropy_bonus(torch.ones(1, 3), coef=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        entropy_bonus(torch.ones(1, 3), coef=0.1, logits=LOGITS, entropy=torch.zeros(1, 3))
