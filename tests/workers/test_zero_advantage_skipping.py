"""`update_actor` leaving zero-advantage rows out, on 2 FSDP2 ranks over real Ray + gloo: the same
weights as the update that computes every row."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from hybridflow.controller import WorkerError
from hybridflow.models.io import load_causal_lm
from hybridflow.protocol import Batch
from tests.workers._policy import actor_group, adam_actor, training_batch, write_policy
from tests.workers.test_actor_update import reference_step
from workers.actor import sequence_log_probs
from workers.config import ActorConfig
from workers.objective import PolicyObjective

ROWS = 16
# Rows 0-7 go to rank 0, rows 8-15 to rank 1; mini-batches of 8 take 4 rows from each rank, in order.
# Zero advantage on rows 4-15: the first mini-batch keeps rows 0-3 (rank 1 keeps none of its 8-11 and
# runs a borrowed, masked row), the second keeps no row at all (rows 4-7 and 12-15): its optimizer step
# sees the zero gradient of one borrowed row per rank.
ZERO_ROWS = list(range(4, ROWS))
# Two AdamW steps of lr 1e-3 move the weights by ~1e-3. The kept rows meet in the same micro-batches
# either way and the left-out rows' gradients are exactly 0, so the weights agree bit for bit here; a
# normaliser counted over the kept rows only, or a skipped optimizer step, would move them by ~lr.
ATOL = 1e-6


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("policy"), seed=5)


def mixed_batch() -> Batch:
    """Rows with and without advantage, including the two edge cases of "zero at every valid token"."""
    batch = training_batch(ROWS, seed=21)
    advantages, mask = batch.pop("advantages")["advantages"], batch["response_mask"]
    advantages[ZERO_ROWS] = 0.0
    # Row 2 carries advantage at its last valid token only: it is kept.
    last = int(mask[2].sum()) - 1
    advantages[2] = 0.0
    advantages[2, last] = 1.5
    # Row 9 is non-zero at a padded token only: its loss is zero, it is left out.
    padded = int(mask[9].sum())
    assert padded < mask.shape[1], "row 9 needs a padded response token"
    advantages[9, padded] = 4.0
    return batch | Batch({"advantages": advantages})


@dataclass(frozen=True)
class EveryRow:
    """An objective behind a plain callable: `update_actor` never leaves rows out for a custom loss."""

    objective: PolicyObjective
    needs_entropy = False
    reads = ("old_log_probs",)

    def __call__(self, *args):
        return self.objective(*args)


def full_and_skipping_updates(policy_dir, config: ActorConfig, name: str, checkpoint: Path):
    """The same optimizer step computed on every row and with the zero-advantage rows left out, from
    the same state (after a first, ordinary step, so that AdamW has moments): weights and metrics."""
    group, pool = actor_group(policy_dir, 2, config, name=name)
    try:
        group.update_actor(training_batch(ROWS, seed=20), temperature=1.0)
        group.save_checkpoint(str(checkpoint))
        saved = group.gather_full_state()[0]
        batch = mixed_batch()
        full_metrics = group.update_actor(batch, temperature=1.0, loss_fn=EveryRow(config.objective()))[0]
        full = group.gather_full_state()[0]
        group.load_checkpoint(str(checkpoint))
        skip_metrics = group.update_actor(batch, temperature=1.0)[0]
        skip = group.gather_full_state()[0]
        return {"saved": saved, "full": (full, full_metrics), "skip": (skip, skip_metrics)}
    finally:
        group.hosts.shutdown()
        pool.release()


def assert_same_weights(actual: dict, expected: dict, atol: float) -> None:
    worst = max((actual[k] - expected[k]).abs().max().item() for k in expected)
    assert worst <= atol, f"largest parameter difference {worst:.3g} > {atol}"


BASE = {"ppo_mini_batch_size": 8, "ppo_micro_batch_size": 2}


@pytest.fixture(scope="module")
def by_rows(ray_cluster, policy_dir, tmp_path_factory):
    return full_and_skipping_updates(policy_dir, adam_actor(**BASE), "rows", tmp_path_factory.mktemp("rows"))


@pytest.fixture(scope="module")
def by_tokens(ray_cluster, policy_dir, tmp_path_factory):
    config = adam_actor(**BASE, dynamic_batching=True, max_tokens_per_micro_batch=24)
    return full_and_skipping_updates(policy_dir, config, "tokens", tmp_path_factory.mktemp("tokens"))


@pytest.mark.parametrize("layout", ["by_rows", "by_tokens"])
def test_skipping_gives_the_weights_of_the_full_update(layout, request):
    results = request.getfixturevalue(layout)
    (full, full_metrics), (skip, skip_metrics) = results["full"], results["skip"]
    assert "actor/rows_skipped" not in full_metrics
    assert skip_metrics["actor/rows_skipped"] == len(ZERO_ROWS)
    assert_same_weights(skip, full, ATOL)
    # Both optimizer steps are taken, the second on a zero gradient.
    assert skip_metrics["actor/grad_norm"] == pytest.approx(full_metrics["actor/grad_norm"], rel=1e-6)


def test_the_comparison_is_not_trivial(by_rows, policy_dir):
    full, saved = by_rows["full"][0], by_rows["saved"]
    moved = max((full[k] - saved[k]).abs().max().item() for k in saved)
    assert moved > 1e-3, "the compared update must move the weights for the comparison to mean anything"
    start = load_causal_lm(policy_dir).state_dict()
    assert max((saved[k] - start[k]).abs().max().item() for k in start) > 1e-4, "AdamW must have moments"
    assert by_rows["full"][1]["actor/grad_norm"] > 0.1


def test_loss_metrics_cover_the_rows_that_entered_the_update(by_rows):
    full, skip = by_rows["full"][1], by_rows["skip"][1]
    # The loss shares of the kept rows add up to the full loss; the second mini-batch's loss is 0
    # either way (all rows zero, or one borrowed row per rank with its response masked).
    assert skip["actor/pg_loss"] == pytest.approx(full["actor/pg_loss"], rel=1e-6)
    # Per-token metrics: a zero-advantage token is never clipped, so the full update's clip fraction
    # over the first mini-batch's tokens, rescaled to the kept rows' tokens, is the skipping update's
    # (the second mini-batch reports 0 either way).
    mask = mixed_batch()["response_mask"]
    first = torch.tensor([0, 1, 2, 3, 8, 9, 10, 11])
    kept_tokens, first_tokens = mask[:4].sum().item(), mask[first].sum().item()
    assert skip["actor/clip_frac"] > 0
    assert skip["actor/clip_frac"] * kept_tokens == pytest.approx(
        full["actor/clip_frac"] * first_tokens, rel=1e-5
    )


@pytest.fixture(scope="module")
def forced(ray_cluster, policy_dir):
    """A 2-rank group with ``skip_zero_advantage_rows: true``, at the policy's initial weights."""
    group, pool = actor_group(
        policy_dir, 2, adam_actor(**BASE, skip_zero_advantage_rows=True), name="forced"
    )
    yield group
    group.hosts.shutdown()
    pool.release()


def test_a_forced_skip_with_an_entropy_bonus_is_refused_on_the_workers(forced):
    with pytest.raises(WorkerError, match=r"ValueError: actor\.skip_zero_advantage_rows=true would change"):
        forced.update_actor(mixed_batch(), temperature=1.0, loss_fn=PolicyObjective(entropy_coef=0.01))


def test_rollout_correction_on_the_workers_equals_the_single_process_step(forced, policy_dir):
    """On-policy (no ``old_log_probs``): the weights compare this forward's log-probs with the engine's,
    here off by +1 nat on rows 0-7 (weight ``min(e, 2) = 2``, truncated) and -0.5 on rows 8-15
    (``e^-0.5``)."""
    batch = training_batch(8, seed=30)
    batch.pop("old_log_probs")
    current = sequence_log_probs(
        load_causal_lm(policy_dir), batch, temperature=1.0, use_packing=False, chunk_size=None
    ).log_probs.detach()
    mask = batch["response_mask"]
    offsets = torch.where(torch.arange(8)[:, None] < 4, -1.0, 0.5) * mask
    objective = PolicyObjective("ppo_clip", rollout_correction="token")
    rollout = Batch({"rollout_log_probs": current + offsets})
    metrics = forced.update_actor(batch | rollout, temperature=1.0, loss_fn=objective)[0]
    expected = reference_step(policy_dir, batch | rollout | Batch({"old_log_probs": current}), objective)
    assert_same_weights(forced.gather_full_state()[0], expected, 1e-5)
    uncorrected = reference_step(policy_dir, batch | Batch({"old_log_probs": current}), PolicyObjective())
    apart = max((expected[k] - uncorrected[k]).abs().max().item() for k in expected)
    assert apart > 1e-4, "the correction must change the step for the comparison to mean anything"
    first, tokens = mask[:4].sum().item(), mask.sum().item()
    assert metrics["rollout_correction/truncated_frac"] == pytest.approx(first / tokens, rel=1e-6)
    assert metrics["rollout_correction/weight_mean"] == pytest.approx(
        (2.0 * first + math.exp(-0.5) * (tokens - first)) / tokens, rel=1e-5
    )
    assert metrics["rollout_correction/log_ratio_mean"] == pytest.approx(
        (1.0 * first - 0.5 * (tokens - first)) / tokens, rel=1e-5
    )
    assert metrics["actor/rows_skipped"] == 0
