"""When the actor update may leave zero-advantage rows out, and why: the objectives it skips for give
exactly the same loss and gradient without those rows, and the ones it refuses do not."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from hybridflow.algos import POLICY_LOSSES, register_policy_loss
from hybridflow.protocol import Batch
from hybridflow.row_order import balanced_update_order, carries_advantage
from workers.objective import PolicyObjective, skips_zero_advantage_rows
from workers.training import update_micro_batches

ROW_LOCAL = ["ppo_clip", "gspo", "reinforce", "cispo", "sapo", "gmpo"]
AGGREGATIONS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
ZERO_ROWS = [1, 3, 4]


def batch_with_zero_rows(seed: int, rows: int = 6, length: int = 7) -> tuple[torch.Tensor, Batch]:
    """Log-probs off the old ones (ratios away from 1, some clipped) and per-token advantages, zero
    at every token of the rows ``ZERO_ROWS``."""
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(length) < torch.randint(2, length + 1, (rows, 1), generator=generator)).long()
    old = (-2.0 + 0.5 * torch.randn(rows, length, generator=generator)) * mask
    log_prob = (old + 0.3 * torch.randn(rows, length, generator=generator)) * mask
    advantages = torch.randn(rows, length, generator=generator) * mask
    advantages[ZERO_ROWS] = 0.0
    return log_prob, Batch({"response_mask": mask, "old_log_probs": old, "advantages": advantages})


def loss_and_grad(
    objective: PolicyObjective, log_prob: torch.Tensor, batch: Batch, tokens: float, rows: float
):
    leaf = log_prob.clone().requires_grad_(True)
    loss, _ = objective(leaf, None, batch, tokens, rows)
    loss.backward()
    return loss.detach(), leaf.grad


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("policy_loss", ROW_LOCAL)
def test_skippable_objectives_give_the_same_loss_and_gradient_without_the_zero_rows(policy_loss, agg):
    objective = PolicyObjective(policy_loss, loss_agg_mode=agg, norm_constant=7.0)
    assert skips_zero_advantage_rows("auto", objective)
    log_prob, batch = batch_with_zero_rows(seed=0)
    tokens, rows = float(batch["response_mask"].sum()), float(len(batch))
    full_loss, full_grad = loss_and_grad(objective, log_prob, batch, tokens, rows)
    kept = carries_advantage(batch).nonzero().squeeze(-1)
    assert kept.tolist() == [0, 2, 5]
    # The full batch's counts: what `update_actor` passes when it leaves rows out.
    part_loss, part_grad = loss_and_grad(objective, log_prob[kept], batch.reorder(kept), tokens, rows)
    assert full_loss.abs() > 1e-3
    torch.testing.assert_close(part_loss, full_loss, rtol=0, atol=1e-7)
    torch.testing.assert_close(part_grad, full_grad[kept], rtol=0, atol=1e-8)
    assert torch.equal(full_grad[ZERO_ROWS], torch.zeros_like(full_grad[ZERO_ROWS]))


def test_kl_cov_depends_on_the_zero_rows_so_it_is_never_skipped():
    objective = PolicyObjective("kl_cov", {"kl_cov_ratio": 0.2})
    log_prob, batch = batch_with_zero_rows(seed=0)
    tokens, rows = float(batch["response_mask"].sum()), float(len(batch))
    full_loss, _ = loss_and_grad(objective, log_prob, batch, tokens, rows)
    kept = carries_advantage(batch).nonzero().squeeze(-1)
    part_loss, _ = loss_and_grad(objective, log_prob[kept], batch.reorder(kept), tokens, rows)
    assert (part_loss - full_loss).abs() > 1e-4
    assert not skips_zero_advantage_rows("auto", objective)
    with pytest.raises(ValueError, match="policy loss 'kl_cov'"):
        skips_zero_advantage_rows(True, objective)


@pytest.mark.parametrize(
    ("objective", "reason"),
    [
        (PolicyObjective(kl_loss_coef=0.1), "the KL loss"),
        (PolicyObjective(entropy_coef=0.01), "the entropy bonus"),
        (PolicyObjective("clip_cov"), "policy loss 'clip_cov'"),
    ],
)
def test_forcing_skipping_with_a_term_on_every_row_is_refused(objective, reason):
    assert not skips_zero_advantage_rows("auto", objective)
    assert not skips_zero_advantage_rows(False, objective)
    with pytest.raises(ValueError, match=f"skip_zero_advantage_rows=true would change the update: {reason}"):
        skips_zero_advantage_rows(True, objective)


def test_a_recipes_own_loss_is_skipped_only_when_forced():
    def linear_pg(log_prob, old_log_prob, advantages, response_mask, **aggregation):
        from hybridflow.algos import aggregate_loss

        mode = aggregation.pop("loss_agg_mode")
        return aggregate_loss(-advantages * log_prob, response_mask, mode, **aggregation), {}

    register_policy_loss("test_zero_advantage_rows.linear_pg")(linear_pg)
    try:
        objective = PolicyObjective("test_zero_advantage_rows.linear_pg")
    finally:
        POLICY_LOSSES.unregister("test_zero_advantage_rows.linear_pg")
    assert not objective.zero_advantage_verified
    assert not skips_zero_advantage_rows("auto", objective)
    assert skips_zero_advantage_rows(True, objective)


def test_a_custom_loss_callable_is_never_skipped():
    def custom(log_prob, entropy, micro_batch, global_tokens, global_seqs):
        return -(log_prob * micro_batch["advantages"]).sum() / global_tokens, {}

    assert not skips_zero_advantage_rows("auto", custom)
    with pytest.raises(ValueError, match="needs a PolicyObjective loss"):
        skips_zero_advantage_rows(True, custom)


def test_carries_advantage_looks_only_at_valid_tokens():
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]])
    advantages = torch.tensor([[0.0, 0.0, 5.0], [0.0, -0.5, 0.0], [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    keep = carries_advantage(Batch({"response_mask": mask, "advantages": advantages}))
    # Row 0 is non-zero only at a padded token; row 3 has no valid token at all.
    assert keep.tolist() == [False, True, True, False]



def test_carries_advantage_looks_only_at_the_tokens_the_loss_mask_keeps():
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]])
    advantages = torch.tensor([[0.0, 3.0, 0.0], [0.0, -0.5, 0.0], [1.0, 1.0, 1.0]])
    loss_mask = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    keep = carries_advantage(Batch({"response_mask": mask, "advantages": advantages, "loss_mask": loss_mask}))
    # Row 0's advantage sits on a token the loss mask drops; row 2 has no token left to train on.
    assert keep.tolist() == [False, True, False]


def _rows(
    prompt_lengths: list[int], response_lengths: list[int], advantages: list[float] | None = None
) -> Batch:
    """Rows with a ``row`` id column, left-padded prompts and right-padded responses of the given
    lengths, and per-row advantages (default: 1)."""
    rows = len(prompt_lengths)
    width = max(prompt_lengths)
    attention_mask = (torch.arange(width) >= width - torch.tensor(prompt_lengths)[:, None]).long()
    response_mask = (torch.arange(max(response_lengths)) < torch.tensor(response_lengths)[:, None]).long()
    per_row = torch.tensor(advantages if advantages is not None else [1.0] * rows)
    return Batch(
        {
            "row": torch.arange(rows),
            "input_ids": 5 * attention_mask,
            "attention_mask": attention_mask,
            "responses": 6 * response_mask,
            "response_mask": response_mask,
            "advantages": per_row[:, None] * response_mask,
        }
    )


@pytest.fixture
def single_rank():
    """A one-process gloo group: `update_micro_batches` agrees its count with the other ranks."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_update_micro_batches_split_the_kept_rows(single_rank):
    batch = _rows([4, 3, 2, 4, 1, 3], [3, 3, 2, 1, 3, 2])
    keep = torch.tensor([True, False, True, True, False, False])
    parts = update_micro_batches(batch, keep, 2, None)
    assert [part["row"].tolist() for part in parts] == [[0, 2], [3]]
    # By tokens (prompt + response, at most 7 per micro-batch): rows 0, 2, 3 hold 7, 4 and 5, one
    # micro-batch each, longest first.
    parts = update_micro_batches(batch, keep, 2, 7)
    assert [part["row"].tolist() for part in parts] == [[0], [3], [2]]
    assert all(torch.equal(p["response_mask"], batch["response_mask"][p["row"]]) for p in parts)


def test_with_no_row_kept_one_borrowed_row_still_runs(single_rank):
    """Every rank runs at least one forward and backward; the borrowed row has the shortest prompt
    (row 4) and its response masked, so its loss and gradient are 0."""
    batch = _rows([4, 3, 2, 4, 1, 3], [3, 3, 2, 1, 3, 2])
    for max_tokens in (None, 7):
        parts = update_micro_batches(batch, torch.zeros(6, dtype=torch.bool), 2, max_tokens)
        assert [part["row"].tolist() for part in parts] == [[4]]
        assert parts[0]["response_mask"].sum() == 0
    assert batch["response_mask"].sum() == 14, "the caller's batch must be left as it was"


def test_balanced_update_order_spreads_the_kept_rows_within_each_mini_batch():
    # Rows 0-3 carry advantage (10, 9, 8, 7 tokens), rows 4-7 do not: in batch order rank 0 would get
    # all 34 kept tokens and rank 1 none.
    batch = _rows([7, 6, 5, 4, 1, 2, 3, 4], [3] * 8, [1.0, -1.0, 2.0, -2.0, 0.0, 0.0, 0.0, 0.0])
    order = balanced_update_order(batch, 2, 8)
    assert sorted(order.tolist()) == list(range(8))
    # Longest first to the lighter rank: 10 -> 0, 9 -> 1, 8 -> 1, 7 -> 0; 17 kept tokens each. The
    # left-out rows (4, 5, 6, 7 tokens) then go longest first to the rank with fewer tokens in all.
    assert set(order[:4].tolist()) == {0, 3, 4, 7}
    assert set(order[4:].tolist()) == {1, 2, 5, 6}

    # Mini-batches of 4 rows (2 per rank): each keeps its own rows, now spread over the ranks.
    order = balanced_update_order(batch, 2, 4)
    assert set(order[[0, 1, 4, 5]].tolist()) == {0, 1, 4, 5}
    assert set(order[[2, 3, 6, 7]].tolist()) == {2, 3, 6, 7}
    assert {order[0].item(), order[4].item()} == {0, 1}
    assert balanced_update_order(batch[:7], 2, 4).tolist() == list(range(7))


def test_balanced_update_order_keeps_the_samples_of_a_prompt_together():
    """Rows of one prompt move as a unit (their prompt then runs once); a unit costs its prompt once.

    Four prompts of 4 samples (prompt lengths 9, 1, 2, 3: `_rows` gives equal-length prompts equal
    tokens), responses of 2 tokens, every row carrying advantage. Unit costs: 9 + 8 = 17, 9, 10, 11.
    Largest first to the lighter rank: 17 -> 0, 11 -> 1, 10 -> 1, 9 -> 0: 26 and 21 tokens.
    """
    batch = _rows([9] * 4 + [1] * 4 + [2] * 4 + [3] * 4, [2] * 16)
    order = balanced_update_order(batch, 2, 16).tolist()
    assert order[:8] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert order[8:] == [12, 13, 14, 15, 8, 9, 10, 11]
    # 12 samples of one prompt do not fit a rank's 8 slots: that unit (9 + 24 = 33) is dealt row by row
    # (11 tokens each) after the 4-row unit (1 + 8 = 9) went to rank 0.
    batch = _rows([9] * 12 + [1] * 4, [2] * 16)
    order = balanced_update_order(batch, 2, 16).tolist()
    assert order[:8] == [12, 13, 14, 15, 1, 3, 5, 7]
    assert order[8:] == [0, 2, 4, 6, 8, 9, 10, 11]
