"""``sampled_mask``: the tokens the engine sampled are not the tokens a loss weighs.

A step may give a sampled token loss weight 0 (a top-entropy mask), and an episode inserts ids the
engine never sampled. The engine-against-trainer gap and the rollout correction's importance ratios
must run over the sampled tokens, whatever the loss weights.
"""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.contract import loss_view, sampled_response_mask
from hybridflow.metrics.rl import log_prob_gap_metrics
from hybridflow.protocol import Batch
from workers.objective import PolicyObjective

RESPONSE = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
SAMPLED = torch.tensor([[1, 1, 0, 1, 0], [1, 1, 1, 0, 0]])  # row 0, position 2: an inserted id
WEIGHTS = torch.tensor([[1.0, 0.0, 0.0, 1.0, 0.0], [0.5, 1.0, 0.0, 0.0, 0.0]])  # sampled tokens of weight 0


def test_sampled_response_mask_by_hand():
    both = Batch({"response_mask": RESPONSE, "sampled_mask": SAMPLED})
    assert torch.equal(sampled_response_mask(both), SAMPLED.bool())
    assert torch.equal(sampled_response_mask(Batch({"response_mask": RESPONSE})), RESPONSE.bool())
    with pytest.raises(ValueError, match="'sampled_mask' has shape \\(2, 4\\)"):
        sampled_response_mask(Batch({"response_mask": RESPONSE, "sampled_mask": SAMPLED[:, :4]}))


def test_loss_view_keeps_sampled_tokens_apart_from_weights():
    batch = Batch({"response_mask": RESPONSE, "sampled_mask": SAMPLED, "loss_mask": WEIGHTS})
    view = loss_view(batch)
    assert torch.equal(view["response_mask"], WEIGHTS * RESPONSE)
    assert torch.equal(view["sampled_mask"], SAMPLED)
    single_turn = loss_view(Batch({"response_mask": RESPONSE, "loss_mask": WEIGHTS}))
    assert torch.equal(single_turn["sampled_mask"], RESPONSE)
    plain = Batch({"response_mask": RESPONSE})
    assert loss_view(plain) is plain


def test_log_prob_gap_counts_sampled_tokens_of_weight_zero_and_skips_inserted_ids():
    old = torch.zeros(2, 5)
    rollout = torch.zeros(2, 5)
    rollout[0, 1] = 0.5  # sampled, loss weight 0: counts
    rollout[0, 2] = 9.0  # inserted: no engine log-prob, must not count
    batch = Batch(
        {
            "response_mask": RESPONSE,
            "sampled_mask": SAMPLED,
            "loss_mask": WEIGHTS,
            "old_log_probs": old,
            "rollout_log_probs": rollout,
        }
    )
    metrics = log_prob_gap_metrics(batch)
    assert metrics["sync/log_prob_abs_diff_max"] == pytest.approx(0.5)
    assert metrics["sync/log_prob_abs_diff_mean"] == pytest.approx(0.5 / SAMPLED.sum().item())


def test_sequence_correction_runs_over_sampled_tokens_not_over_loss_weights():
    """``reinforce`` with ``seq-mean-token-mean``: row i's loss is ``w_i * sum_t(-A m_t r_t) / sum_t m_t``
    over the tokens of non-zero weight, with ``w_i = min(exp(sum over *sampled* t of old - rollout), C)``."""
    generator = torch.Generator().manual_seed(0)
    old = -1.0 - torch.rand(2, 5, generator=generator)
    rollout = old - 0.2 * torch.rand(2, 5, generator=generator)
    log_prob = old + 0.05 * torch.randn(2, 5, generator=generator)
    advantages = torch.tensor([[1.0], [-2.0]]).expand(2, 5)
    batch = Batch(
        {
            "response_mask": RESPONSE,
            "sampled_mask": SAMPLED,
            "loss_mask": WEIGHTS,
            "old_log_probs": old,
            "rollout_log_probs": rollout,
            "advantages": advantages,
        }
    )
    cap = 10.0
    objective = PolicyObjective(
        "reinforce", loss_agg_mode="seq-mean-token-mean", rollout_correction="sequence", rollout_correction_cap=cap
    )
    loss, _ = objective(log_prob, None, loss_view(batch), float((WEIGHTS > 0).sum()), 2.0)
    expected = 0.0
    for row in range(2):
        sampled = SAMPLED[row].bool()
        weight = min(math.exp((old[row] - rollout[row])[sampled].sum().item()), cap)
        weighted = WEIGHTS[row] * RESPONSE[row]
        per_token = -advantages[row] * torch.exp(log_prob[row] - old[row]) * weighted
        expected += weight * per_token.sum().item() / (weighted > 0).sum().item()
    assert_close(loss.item(), expected / 2, rtol=1e-5, atol=1e-6)
