"""Clipped value loss against numbers worked out by hand."""

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import clipped_value_loss

# Token 0: V=1,  old=1,   R=2   -> unclipped 1,  V_clip=1   -> 1      -> 0.5 * 1    (not clipped)
# Token 1: V=2,  old=1,   R=3   -> unclipped 1,  V_clip=1.2 -> 3.24   -> 0.5 * 3.24 (clipped)
# Token 2: V=0,  old=0.5, R=0   -> unclipped 0,  V_clip=0.3 -> 0.09   -> 0.5 * 0.09 (clipped)
# Token 3: V=2,  old=1,   R=1.5 -> unclipped .25, V_clip=1.2 -> 0.09  -> 0.5 * 0.25 (not clipped)
# Token 4: masked junk.
VALUES = torch.tensor([[1.0, 2.0, 0.0, 2.0, 50.0]])
OLD = torch.tensor([[1.0, 1.0, 0.5, 1.0, -50.0]])
RETURNS = torch.tensor([[2.0, 3.0, 0.0, 1.5, 0.0]])
MASK = torch.tensor([[1, 1, 1, 1, 0]])


def test_clipped_value_loss_by_hand():
    values = VALUES.clone().requires_grad_(True)
    loss, metrics = clipped_value_loss(values, OLD, RETURNS, MASK, cliprange_value=0.2)
    assert_close(loss, torch.tensor(0.5 * (1 + 3.24 + 0.09 + 0.25) / 4))
    assert_close(metrics["clip_frac"], torch.tensor(2 / 4))
    loss.backward()
    # Gradient (V - R) / 4 where the unclipped term wins, 0 where the clipped one does.
    assert_close(values.grad, torch.tensor([[(1 - 2) / 4, 0.0, 0.0, (2 - 1.5) / 4, 0.0]]))


def test_value_loss_without_clipping():
    loss, metrics = clipped_value_loss(VALUES, OLD, RETURNS, MASK, cliprange_value=None)
    assert_close(loss, torch.tensor(0.5 * (1 + 1 + 0 + 0.25) / 4))
    assert_close(metrics["clip_frac"], torch.tensor(0.0))


def test_value_loss_aggregation_mode():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    values = torch.tensor([[1.0, 2.0, 0, 0, 0], [3.0, 0, 0, 0, 0]])
    returns = torch.tensor([[2.0, 2.0, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    loss, _ = clipped_value_loss(
        values, values, returns, mask, cliprange_value=None, loss_agg_mode="seq-mean-token-sum"
    )
    # Row 0: 0.5 * (1 + 0); row 1: 0.5 * 4; mean over 2 sequences.
    assert_close(loss, torch.tensor((0.5 + 2.0) / 2))


def test_value_loss_validates():
    with pytest.raises(ValueError, match="cliprange_value"):
        clipped_value_loss(VALUES, OLD, RETURNS, MASK, cliprange_value=-1.0)
    with pytest.raises(ValueError, match="shape"):
        clipped_value_loss(VALUES, OLD[:, :3], RETURNS, MASK)


def test_clip_frac_ignores_an_unclipped_value_that_the_round_trip_misses_by_an_ulp():
    # All values lie within 0.2 of the old ones, so nothing is clipped. For the first two tokens,
    # V_old + (V - V_old) is not V in fp32, and its error from R is the larger: computing the clipped value
    # that way counted them as clipped.
    values = torch.tensor([[0.02, 0.05, 0.3]], requires_grad=True)
    old = torch.tensor([[0.1, 0.12, 0.35]])
    returns = torch.tensor([[0.0, 0.0, 0.3]])
    mask = torch.ones(1, 3)
    round_trip = old + (values.detach() - old)
    assert bool((round_trip != values)[0, :2].all())
    assert bool(((round_trip - returns) ** 2 > (values - returns) ** 2)[0, :2].all())

    loss, metrics = clipped_value_loss(values, old, returns, mask, cliprange_value=0.2)
    assert metrics["clip_frac"].item() == 0.0
    assert_close(loss, torch.tensor(0.5 * (0.02**2 + 0.05**2 + 0.0) / 3))
    loss.backward()
    assert_close(values.grad, torch.tensor([[0.02 / 3, 0.05 / 3, 0.0]]))
