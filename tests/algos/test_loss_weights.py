"""Per-token loss weights in the mask: a token's weight multiplies its loss term, the counts count the
tokens of non-zero weight, and a 0/1 weight is the mask it was before, bit for bit."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import (
    POLICY_LOSSES,
    aggregate_loss,
    compute_policy_loss,
    entropy_bonus,
    masked_sum,
    weighted_sum,
)

# Row 0: weights 0.5 and 2 (a 0 between them); row 1: one token of weight 3; row 2: none. The positions
# of weight 0 hold nan/inf, which must not leak into a value or a gradient.
LOSS = torch.tensor([[1.0, math.nan, 2.0], [4.0, math.inf, -math.inf], [7.0, 8.0, 9.0]])
WEIGHTS = torch.tensor([[0.5, 0.0, 2.0], [3.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
# Every policy loss the library ships (a test module may register its own at import).
SHIPPED_LOSSES = [
    name for name in POLICY_LOSSES.names() if POLICY_LOSSES.get(name).__module__.startswith("hybridflow.")
]


def test_weighted_sum_by_hand_and_its_gradient_stays_finite():
    values = LOSS.clone().requires_grad_(True)
    total = weighted_sum(values, WEIGHTS)
    assert total.item() == 0.5 * 1 + 2 * 2 + 3 * 4
    total.backward()
    assert torch.equal(values.grad, WEIGHTS)
    assert torch.equal(weighted_sum(LOSS, WEIGHTS, dim=-1), torch.tensor([4.5, 12.0, 0.0]))
    # The statistics helpers count a token once, whatever its weight.
    assert torch.equal(masked_sum(LOSS, WEIGHTS, dim=-1), torch.tensor([3.0, 4.0, 0.0]))


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, (0.5 * 1 + 2 * 2 + 3 * 4) / 3),  # 3 tokens of non-zero weight, not 5.5
        ("token-mean", {"global_token_count": 10}, (0.5 * 1 + 2 * 2 + 3 * 4) / 10),
        ("seq-mean-token-mean", {}, ((0.5 * 1 + 2 * 2) / 2 + 3 * 4 / 1) / 2),
        ("seq-mean-token-sum", {}, ((0.5 * 1 + 2 * 2) + 3 * 4) / 2),
        ("seq-mean-token-sum-norm", {"norm_constant": 4}, ((0.5 * 1 + 2 * 2) / 4 + 3 * 4 / 4) / 2),
    ],
)
def test_weighted_modes_by_hand(mode, kwargs, expected):
    assert_close(aggregate_loss(LOSS, WEIGHTS, mode, **kwargs), torch.tensor(expected))


@pytest.mark.parametrize("mode", MODES)
def test_a_0_1_weight_is_the_mask_bit_for_bit(mode):
    mask = (WEIGHTS != 0).long()
    values = torch.randn(3, 3, generator=torch.Generator().manual_seed(0))
    as_mask = values.clone().requires_grad_(True)
    as_weight = values.clone().requires_grad_(True)
    # The 0/1 mask the aggregations took before per-token weights: a sum under torch.where.
    kept = torch.where(mask.bool(), as_mask, torch.zeros(()))
    per_row = kept.sum(-1)
    counts = mask.sum(-1).float()
    rows = (counts > 0).sum()
    reference = {
        "token-mean": kept.sum() / mask.sum(),
        "seq-mean-token-mean": (per_row / counts.clamp(min=1)).sum() / rows,
        "seq-mean-token-sum": per_row.sum() / rows,
        "seq-mean-token-sum-norm": per_row.sum() / 3.0 / rows,
    }[mode]
    weighted = aggregate_loss(as_weight, mask.float(), mode)
    assert torch.equal(weighted, reference)
    reference.backward()
    weighted.backward()
    assert torch.equal(as_weight.grad, as_mask.grad)


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    rows, width = 6, 8
    response_mask = (torch.arange(width) < torch.tensor([8, 6, 3, 1, 5, 7])[:, None]).long()
    weights = torch.rand(rows, width, generator=generator) * 2 + 0.25
    weights = weights * (torch.rand(rows, width, generator=generator) < 0.7) * response_mask
    old = -torch.rand(rows, width, generator=generator) * 3
    return {
        "log_prob": old + 0.3 * torch.randn(rows, width, generator=generator),
        "old_log_prob": old,
        "advantages": torch.randn(rows, 1, generator=generator) + 0.1 * torch.randn(rows, width, generator=generator),
        "weights": weights,
    }


def _call(name: str, inputs: dict[str, torch.Tensor], mask: torch.Tensor, mode, **counts):
    params = {"clip_cov_ratio": 0.3, "generator": torch.Generator().manual_seed(1)} if name == "clip_cov" else {}
    params |= {"kl_cov_ratio": 0.3} if name == "kl_cov" else {}
    log_prob = inputs["log_prob"].clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(
        name, log_prob, inputs["old_log_prob"], inputs["advantages"], mask, loss_agg_mode=mode, **counts, **params
    )
    loss.backward()
    return loss, metrics, log_prob.grad


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SHIPPED_LOSSES)
def test_every_policy_loss_multiplies_each_token_by_its_weight(name, mode):
    assert len(SHIPPED_LOSSES) >= 8
    inputs = _inputs(seed=3)
    weights = inputs["weights"]
    support = (weights != 0).long()
    per_token = {}

    def capture(loss_mat, mask, **counts):
        per_token["loss_mat"] = loss_mat.detach()
        return aggregate_loss(loss_mat, mask, mode, **counts)

    counts = {"global_token_count": 40, "global_seq_count": 7, "norm_constant": 8.0}
    _, plain_metrics, _ = _call(name, inputs, support, capture, **counts)
    loss_mat = per_token["loss_mat"]
    loss, metrics, grad = _call(name, inputs, weights, capture, **counts)
    # The per-token losses (gspo's and gmpo's sequence ratios, the covariance selections) and the
    # metrics are those of the tokens of non-zero weight, whatever the weights' values.
    assert torch.equal(per_token["loss_mat"], loss_mat)
    assert plain_metrics.keys() == metrics.keys()
    for key, value in metrics.items():
        assert torch.equal(value, plain_metrics[key]), key
    # The weighted aggregation by hand, from the per-token losses.
    kept = torch.where(weights != 0, weights * loss_mat, torch.zeros(()))
    per_row = kept.sum(-1)
    expected = {
        "token-mean": kept.sum() / 40,
        "seq-mean-token-mean": (per_row / support.sum(-1).clamp(min=1)).sum() / 7,
        "seq-mean-token-sum": per_row.sum() / 7,
        "seq-mean-token-sum-norm": per_row.sum() / 8.0 / 7,
    }[mode]
    assert_close(loss, expected)
    # Doubling every weight doubles the loss and its gradient, exactly.
    doubled, _, doubled_grad = _call(name, inputs, 2 * weights, capture, **counts)
    assert torch.equal(doubled, 2 * loss)
    assert torch.equal(doubled_grad, 2 * grad)
    assert grad.abs().sum() > 0


def test_entropy_bonus_weighs_the_term_and_reports_the_plain_entropy():
    entropy = torch.tensor([[1.0, math.nan, 0.5], [2.0, math.inf, 1.0], [3.0, 3.0, 3.0]])
    bonus, mean_entropy = entropy_bonus(WEIGHTS, coef=0.1, entropy=entropy, global_token_count=4)
    assert_close(bonus, torch.tensor(-0.1 * (0.5 * 1.0 + 2 * 0.5 + 3 * 2.0) / 4))
    assert_close(mean_entropy, torch.tensor((1.0 + 0.5 + 2.0) / 4))
