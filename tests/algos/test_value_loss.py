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
