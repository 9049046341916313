"""Rollout correction (truncated importance weights against the engine's log-probs), against numbers
worked out by hand, and through the actor's `PolicyObjective`."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import rollout_correction_weights
from hybridflow.protocol import Batch
from workers.objective import PolicyObjective

# Two rows, the second with a masked last token whose log-probs are nonsense (never read).
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.2, 0.0]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-0.1, -0.4, -9.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# old - rollout on the valid tokens: row 0: 0.5, -1.0, 0.0 (sum -0.5); row 1: -0.2, 0.2 (sum 0.0).
LOG_RATIOS = [0.5, -1.0, 0.0, -0.2, 0.2]


def test_token_level_weights_and_truncation_by_hand():
    weights, metrics = rollout_correction_weights(OLD, ROLLOUT, MASK, level="token", cap=1.5)
    # exp(0.5) = 1.6487 > 1.5 is truncated; the masked token gets 1.
    expected = torch.tensor([[1.5, math.exp(-1.0), 1.0], [math.exp(-0.2), math.exp(0.2), 1.0]])
    assert_close(weights, expected)
    assert not weights.requires_grad
    assert metrics["weight_mean"].item() == pytest.approx(
        (1.5 + math.exp(-1.0) + 1.0 + math.exp(-0.2) + math.exp(0.2)) / 5, rel=1e-6
    )
    assert metrics["truncated_frac"].item() == pytest.approx(1 / 5)
    assert metrics["log_prob_gap_mean"].item() == pytest.approx(sum(abs(x) for x in LOG_RATIOS) / 5, rel=1e-6)
    assert metrics["log_ratio_mean"].item() == pytest.approx(sum(LOG_RATIOS) / 5, abs=1e-7)


def test_sequence_level_weights_and_truncation_by_hand():
    weights, metrics = rollout_correction_weights(OLD, ROLLOUT, MASK, level="sequence", cap=0.9)
    # Row 0: exp(-0.5) = 0.6065 on every token; row 1: exp(0) = 1 > 0.9, truncated on its 2 tokens.
    expected = torch.tensor([[math.exp(-0.5)] * 3, [0.9, 0.9, 1.0]])
    assert_close(weights, expected)
    assert metrics["truncated_frac"].item() == pytest.approx(2 / 5)
    assert metrics["weight_mean"].item() == pytest.approx((3 * math.exp(-0.5) + 2 * 0.9) / 5, rel=1e-6)


def test_a_long_sequence_overflowing_exp_is_truncated_not_inf():
    old = torch.zeros(1, 400)
    rollout = torch.full((1, 400), -0.5)  # summed log-ratio 200 nats: exp overflows fp32
    weights, metrics = rollout_correction_weights(old, rollout, torch.ones(1, 400), level="sequence", cap=2.0)
    assert torch.equal(weights, torch.full((1, 400), 2.0))
    assert metrics["truncated_frac"].item() == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"level": "tokens", "cap": 2.0}, "level must be one of"),
        ({"level": "token", "cap": 0.0}, "cap must be > 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        rollout_correction_weights(OLD, ROLLOUT, MASK, **kwargs)
    with pytest.raises(ValueError, match="one \\[batch, response_len\\] shape"):
        rollout_correction_weights(OLD, ROLLOUT[:, :2], MASK, level="token", cap=2.0)


def micro_batch(seed: int, rows: int = 4, length: int = 6) -> tuple[torch.Tensor, Batch]:
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(length) < torch.randint(2, length + 1, (rows, 1), generator=generator)).long()
    old = (-2.0 + 0.5 * torch.randn(rows, length, generator=generator)) * mask
    log_prob = (old + 0.1 * torch.randn(rows, length, generator=generator)) * mask
    rollout = (old + 0.3 * torch.randn(rows, length, generator=generator)) * mask
    columns = {
        "response_mask": mask,
        "old_log_probs": old,
        "advantages": torch.randn(rows, 1, generator=generator) * mask,
        "rollout_log_probs": rollout,
    }
    return log_prob, Batch(columns)


def loss_and_grad(objective: PolicyObjective, log_prob: torch.Tensor, batch: Batch):
    leaf = log_prob.clone().requires_grad_(True)
    mask = batch["response_mask"]
    loss, metrics = objective(leaf, None, batch, float(mask.sum()), float(len(batch)))
    loss.backward()
    return loss.detach(), leaf.grad, metrics


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize(
    ("policy_loss", "agg"),
    [("ppo_clip", "token-mean"), ("gspo", "seq-mean-token-mean"), ("cispo", "token-mean")],
)
def test_engine_log_probs_equal_to_the_trainers_leave_the_loss_unchanged(level, policy_loss, agg):
    log_prob, batch = micro_batch(seed=1)
    batch.pop("rollout_log_probs")
    same = batch | Batch({"rollout_log_probs": batch["old_log_probs"].clone()})
    plain = loss_and_grad(PolicyObjective(policy_loss, loss_agg_mode=agg), log_prob, batch)
    corrected = loss_and_grad(
        PolicyObjective(policy_loss, loss_agg_mode=agg, rollout_correction=level), log_prob, same
    )
    assert torch.equal(corrected[0], plain[0])
    assert torch.equal(corrected[1], plain[1])
    assert corrected[2]["rollout_correction/weight_mean"] == pytest.approx(1.0)
    assert corrected[2]["rollout_correction/truncated_frac"] == 0.0


def test_token_weights_multiply_the_per_token_policy_loss():
    """``reinforce`` with token-mean: value ``sum(-A w m) / N``, gradient ``-A r w m / N`` per token,
    with ``r = pi / pi_old`` and ``w`` the truncated weight computed here by hand."""
    log_prob, batch = micro_batch(seed=2)
    mask = batch["response_mask"].bool()
    cap = 1.2
    loss, grad, metrics = loss_and_grad(
        PolicyObjective("reinforce", rollout_correction="token", rollout_correction_cap=cap), log_prob, batch
    )
    gap = batch["old_log_probs"] - batch["rollout_log_probs"]
    weight = torch.where(mask, torch.exp(gap).clamp(max=cap), torch.zeros_like(gap))
    ratio = torch.exp(log_prob - batch["old_log_probs"])
    tokens = mask.sum()
    per_token = -batch["advantages"] * ratio * weight
    assert_close(loss, per_token[mask].sum() / tokens)
    assert_close(grad, torch.where(mask, per_token / tokens, torch.zeros_like(per_token)))
    assert (torch.exp(gap)[mask] > cap).any(), (
        "the batch must have truncated tokens for the test to mean anything"
    )
    assert metrics["rollout_correction/truncated_frac"] == pytest.approx(
        ((torch.exp(gap) > cap) & mask).sum().item() / tokens.item()
    )
    assert metrics["rollout_correction/log_prob_gap_mean"] == pytest.approx(
        gap[mask].abs().mean().item(), rel=1e-6
    )


def test_sequence_weights_scale_each_rows_share_of_the_loss():
    """At sequence level with ``seq-mean-token-mean``, each row's mean token loss is scaled by its
    truncated sequence ratio ``min(exp(sum_t (old - rollout)), C)``."""
    log_prob, batch = micro_batch(seed=3)
    mask = batch["response_mask"].bool()
    cap = 1.5
    plain_objective = PolicyObjective("ppo_clip", loss_agg_mode="seq-mean-token-mean")
    corrected_objective = PolicyObjective(
        "ppo_clip",
        loss_agg_mode="seq-mean-token-mean",
        rollout_correction="sequence",
        rollout_correction_cap=cap,
    )
    corrected, _, _ = loss_and_grad(corrected_objective, log_prob, batch)
    per_row = []
    for row in range(len(batch)):
        one = batch[row]
        row_loss, _, _ = loss_and_grad(plain_objective, log_prob[row : row + 1], one)
        gap = (one["old_log_probs"] - one["rollout_log_probs"])[one["response_mask"].bool()].sum()
        per_row.append(row_loss * min(math.exp(gap.item()), cap))
    assert_close(corrected, sum(per_row) / len(batch))
    assert mask.any(dim=1).all()


def test_missing_rollout_log_probs_name_the_column():
    log_prob, batch = micro_batch(seed=4)
    batch.pop("rollout_log_probs")
    with pytest.raises(KeyError, match="rollout_correction='token' needs the column 'rollout_log_probs'"):
        loss_and_grad(PolicyObjective(rollout_correction="token"), log_prob, batch)


def test_objective_refuses_an_unknown_level_or_cap():
    with pytest.raises(ValueError, match="rollout_correction must be one of"):
        PolicyObjective(rollout_correction="tis")
    with pytest.raises(ValueError, match="rollout_correction_cap must be > 0"):
        PolicyObjective(rollout_correction="token", rollout_correction_cap=-1.0)
