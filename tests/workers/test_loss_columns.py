"""Columns reach the loss that declares them, and ``loss_mask`` weighs every loss term per token (a 0/1
one is a mask, bit for bit): `trainer.steps.update_columns` on the controller, `PolicyObjective` in one
process, `update_actor` on 2 real Ray + gloo FSDP2 ranks, against single-process hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.contract import MODEL_INPUTS, MissingColumnError, loss_response_mask
from hybridflow.models.io import load_causal_lm
from hybridflow.protocol import Batch
from tests.workers._policy import ADAM, actor_group, adam_actor, training_batch, write_policy
from trainer.steps import update_columns
from workers.actor import sequence_log_probs
from workers.objective import PolicyObjective

ROWS = 8
ATOL = 5e-5  # as in test_actor_update: fp32 sums in another order move AdamW's first step by ~1e-5


class TokenWeightedLoss:
    """A recipe-style loss that reads a column of its own: ``-sum(w * log_prob) / tokens``, and
    reports the sum of the weights it saw on the response tokens."""

    needs_entropy = False
    reads = ("my_token_weights",)

    def __call__(self, log_prob, entropy, micro_batch, global_tokens, global_seqs):
        weights = micro_batch["my_token_weights"] * micro_batch["response_mask"]
        loss = -(weights * log_prob).sum() / global_tokens
        return loss, {"custom/weight_sum": float(weights.sum())}


def weighted_batch() -> Batch:
    batch = training_batch(ROWS, seed=11)
    weights = torch.arange(batch["responses"].numel(), dtype=torch.float32).view_as(batch["old_log_probs"])
    return batch | Batch({"my_token_weights": weights / 7.0})


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("policy"), seed=5)


@pytest.fixture(scope="module")
def group(ray_cluster, policy_dir):
    group, pool = actor_group(policy_dir, 2, adam_actor(ppo_mini_batch_size=ROWS, ppo_micro_batch_size=2))
    yield group
    group.hosts.shutdown()
    pool.release()


def test_the_update_sends_what_the_loss_declares():
    batch = weighted_batch() | Batch({"unread": torch.zeros(ROWS)})
    columns = update_columns(batch, TokenWeightedLoss())
    assert set(columns) == {*MODEL_INPUTS, "advantages", "old_log_probs", "my_token_weights"}
    kl = PolicyObjective(kl_loss_coef=0.1)
    with pytest.raises(MissingColumnError, match=r"update_actor's loss_fn needs column 'ref_log_probs'"):
        update_columns(batch, kl)


def test_a_declared_column_the_batch_lacks_is_named_before_anything_is_sent():
    batch = weighted_batch().select(*MODEL_INPUTS, "advantages", "old_log_probs")
    with pytest.raises(
        MissingColumnError, match=r"needs column 'my_token_weights'; the batch has: advantages"
    ):
        update_columns(batch, TokenWeightedLoss())


def test_a_malformed_loss_mask_is_refused_by_name():
    batch = weighted_batch()
    assert batch["response_mask"][3:5].tolist() == [[1] + [0] * 9, [1] * 6 + [0] * 4]
    for bad in (-0.5, math.nan, math.inf):
        weights = torch.ones_like(batch["old_log_probs"])
        weights[3, 5] = bad  # padding: never read
        weights[4, 4] = bad
        with pytest.raises(ValueError, match=rf"'loss_mask' must hold a finite weight >= 0 .* row 4 holds {bad}"):
            update_columns(batch | Batch({"loss_mask": weights}), TokenWeightedLoss())
    with pytest.raises(ValueError, match=r"'loss_mask' has shape \(8, 3\)"):
        update_columns(batch | Batch({"loss_mask": torch.ones(ROWS, 3)}), TokenWeightedLoss())
    # Weights other than 0 and 1 are weights; what a padded position holds is never read.
    weights = torch.full_like(batch["old_log_probs"], 0.5)
    weights[4, 7] = math.nan
    assert "loss_mask" in update_columns(batch | Batch({"loss_mask": weights}), TokenWeightedLoss())
    expected = 0.5 * batch["response_mask"].float()
    assert torch.equal(loss_response_mask(batch | Batch({"loss_mask": weights})), expected)


OBJECTIVE = PolicyObjective(
    "ppo_clip", {"clip_eps_low": 0.2, "clip_eps_high": 0.2}, entropy_coef=0.01, kl_loss_coef=0.5, kl_estimator="k1"
)


def test_a_0_1_loss_mask_gives_the_masked_loss_bit_for_bit():
    batch = training_batch(ROWS, seed=14)
    generator = torch.Generator().manual_seed(15)
    log_prob = batch["old_log_probs"] + 0.2 * torch.randn(batch["old_log_probs"].shape, generator=generator)
    entropy = torch.rand(batch["old_log_probs"].shape, generator=generator)
    ref = batch["old_log_probs"] + 0.3 * torch.randn(batch["old_log_probs"].shape, generator=generator)
    loss_mask = (torch.rand(batch["old_log_probs"].shape, generator=generator) < 0.6).float()
    batch = batch | Batch({"ref_log_probs": ref * batch["response_mask"], "loss_mask": loss_mask})
    part = batch.select("old_log_probs", "ref_log_probs", "advantages") | Batch(
        {"response_mask": loss_response_mask(batch)}
    )
    mask = (batch["response_mask"] * loss_mask).bool()
    tokens = mask.sum()

    # The 0/1 mask as every term took it before per-token weights: sums under torch.where.
    def masked_mean(values):
        return torch.where(mask, values, torch.zeros(())).sum() / tokens

    by_hand = log_prob.clone().requires_grad_(True)
    ratio = torch.exp((by_hand - batch["old_log_probs"]).clamp(-20.0, 20.0))
    advantages = batch["advantages"]
    pg_loss = masked_mean(torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2)))
    expected = pg_loss + -0.01 * masked_mean(entropy) + 0.5 * masked_mean(by_hand - batch["ref_log_probs"])
    expected.backward()

    weighted = log_prob.clone().requires_grad_(True)
    loss, metrics = OBJECTIVE(weighted, entropy, part, float(tokens), float(ROWS))
    loss.backward()
    assert torch.equal(loss, expected)
    assert torch.equal(weighted.grad, by_hand.grad)
    assert metrics["actor/pg_loss"] == pg_loss.item()
    assert metrics["actor/entropy"] == masked_mean(entropy).item()


def test_loss_weights_match_a_hand_computation_with_kl_and_entropy(group, policy_dir):
    # First on the group: its weights and optimizer are still the fresh ones the reference starts from.
    batch = training_batch(ROWS, seed=12)
    generator = torch.Generator().manual_seed(13)
    ref = batch["old_log_probs"] + 0.3 * torch.randn(batch["old_log_probs"].shape, generator=generator)
    # Weights in [0.25, 2.25) on about 60% of the tokens, 0 on the others.
    keep = torch.rand(batch["old_log_probs"].shape, generator=generator) < 0.6
    weights = (0.25 + 2 * torch.rand(batch["old_log_probs"].shape, generator=generator)) * keep
    batch = batch | Batch({"ref_log_probs": ref * batch["response_mask"], "loss_mask": weights})
    assert set(update_columns(batch, OBJECTIVE)) >= {"loss_mask", "ref_log_probs"}

    # By hand, in one process: the forward on the real response mask; each token's terms times its
    # weight, over the number of tokens of non-zero weight.
    model = load_causal_lm(policy_dir).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=ADAM.lr, betas=ADAM.betas, weight_decay=ADAM.weight_decay
    )
    out = sequence_log_probs(
        model, batch, temperature=1.0, use_packing=False, chunk_size=None, stats=("log_prob", "entropy")
    )
    weight = batch["response_mask"] * weights
    tokens = (weight > 0).sum()
    ratio = torch.exp(out.log_probs - batch["old_log_probs"])
    advantages = batch["advantages"]
    per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
    pg_loss = (per_token * weight).sum() / tokens
    kl_loss = ((out.log_probs - batch["ref_log_probs"]) * weight).sum() / tokens
    bonus = (out.entropy * weight).sum() / tokens
    (pg_loss + 0.5 * kl_loss - 0.01 * bonus).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), ADAM.grad_clip)
    optimizer.step()
    # The weights matter: the 0/1 mask of the same tokens gives another loss.
    masked = (per_token * (weight > 0)).sum() / tokens
    assert abs(masked.item() - pg_loss.item()) > 1e-3
    # The entropy metric counts each token of non-zero weight once.
    entropy = (out.entropy * (weight > 0)).sum() / tokens

    before = group.gather_full_state()[0]
    metrics = group.update_actor(
        batch.select(*update_columns(batch, OBJECTIVE)), temperature=1.0, loss_fn=OBJECTIVE
    )[0]
    assert metrics["actor/pg_loss"] == pytest.approx(pg_loss.item(), abs=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(kl_loss.item(), abs=1e-5)
    assert metrics["actor/entropy"] == pytest.approx(entropy.item(), abs=1e-5)
    assert abs(entropy.item() - bonus.item()) > 1e-3
    after = group.gather_full_state()[0]
    expected = {k: v.detach() for k, v in model.state_dict().items()}
    moved = max((after[k] - before[k]).abs().max().item() for k in after)
    assert moved > 5e-4
    worst = max((after[k] - expected[k]).abs().max().item() for k in expected)
    assert worst <= ATOL, f"largest parameter difference {worst:.3g} > {ATOL}"


def test_a_recipe_loss_gets_its_own_column_on_the_workers(group):
    batch = weighted_batch()
    metrics = group.update_actor(
        batch.select(*update_columns(batch, TokenWeightedLoss())),
        temperature=1.0,
        loss_fn=TokenWeightedLoss(),
    )[0]
    expected = float((batch["my_token_weights"] * batch["response_mask"]).sum())
    assert metrics["custom/weight_sum"] == pytest.approx(expected, rel=1e-6)
