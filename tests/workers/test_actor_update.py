"""`update_actor` on FSDP2 over real Ray + gloo ranks, against a single-process reference."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.algos import (
    AGGREGATION_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    UnknownNameError,
    aggregate_loss,
    masked_mean,
    register_aggregation_mode,
    register_kl_estimator,
    register_policy_loss,
)
from hybridflow.controller import WorkerError
from hybridflow.models.io import load_causal_lm
from hybridflow.protocol import Batch
from tests.workers._policy import ADAM, actor_group, adam_actor, training_batch, write_policy
from workers.actor import sequence_log_probs
from workers.config import ActorConfig
from workers.objective import PolicyObjective

ROWS = 8
# fp32 sums in another order (per rank, per micro-batch, reduce-scatter, attention kernel) move the
# gradients by ~1e-7. AdamW's first step moves each weight by lr * g / (|g| + eps): by +-lr wherever
# |g| >> eps, but a weight whose gradient is near eps = 1e-8 moves by a rounding-sensitive fraction of
# lr (measured up to 1.2e-5 between the packed 2-rank update and the padded reference). A wrong
# normaliser or a missed gradient moves weights by ~lr = 1e-3.
ATOL = 5e-5
MOVED = 1e-3  # a different loss moves some weight by at least this much


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("policy"), seed=3)


@pytest.fixture(scope="module")
def objective():
    return PolicyObjective("ppo_clip", {"clip_eps_low": 0.2, "clip_eps_high": 0.28})


def reference_step(policy_dir, batch: Batch, objective: PolicyObjective) -> dict[str, torch.Tensor]:
    """The same update done in this process, on the full batch at once, without packing."""
    return reference_step_with_metrics(policy_dir, batch, objective)[0]


def reference_step_with_metrics(
    policy_dir, batch: Batch, objective: PolicyObjective
) -> tuple[dict[str, torch.Tensor], dict[str, float], torch.Tensor]:
    """`reference_step`, also returning the objective's metrics and the log-probs before the step."""
    model = load_causal_lm(policy_dir).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=ADAM.lr, betas=ADAM.betas, weight_decay=ADAM.weight_decay
    )
    out = sequence_log_probs(
        model, batch, temperature=1.0, use_packing=False, chunk_size=None
    )
    mask = batch["response_mask"]
    loss, metrics = objective(out.log_probs, None, batch, float(mask.sum()), float(len(batch)))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), ADAM.grad_clip)
    optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}, metrics, out.log_probs.detach()


def assert_same_weights(actual: dict, expected: dict, atol: float) -> None:
    assert actual.keys() == expected.keys()
    worst = max((actual[k] - expected[k]).abs().max().item() for k in expected)
    assert worst <= atol, f"largest parameter difference {worst:.3g} > {atol}"


@pytest.fixture(scope="module")
def updated(ray_cluster, policy_dir, objective):
    """Parameters after one update on the same batch, for three layouts of the same step."""
    batch = training_batch(ROWS, seed=0)
    results = {}
    layouts = [
        ("w2_micro4", 2, 4, False),
        ("w2_micro1", 2, 1, False),
        ("w1_micro4", 1, 4, False),
        ("w2_micro1_gather_once", 2, 1, True),
    ]
    for name, world, micro, gather_once in layouts:
        config = adam_actor(
            ppo_mini_batch_size=ROWS, ppo_micro_batch_size=micro, gather_once_per_mini_batch=gather_once
        )
        group, pool = actor_group(policy_dir, world, config, name=name)
        metrics = group.update_actor(batch, temperature=1.0, loss_fn=objective)
        results[name] = (group.gather_full_state()[0], metrics[0])
        group.hosts.shutdown()
        pool.release()
    return batch, results


def test_two_rank_fsdp_step_equals_single_process_step(updated, policy_dir, objective):
    batch, results = updated
    expected = reference_step(policy_dir, batch, objective)
    start = {k: v for k, v in load_causal_lm(policy_dir).state_dict().items()}
    moved = max((expected[k] - start[k]).abs().max().item() for k in start)
    assert moved > 5e-4, "the reference step must move the weights for the comparison to mean anything"
    assert_same_weights(results["w2_micro4"][0], expected, ATOL)


def test_update_does_not_depend_on_micro_batch_or_world_size(updated):
    _, results = updated
    base, base_metrics = results["w2_micro4"]
    assert_same_weights(results["w2_micro1"][0], base, ATOL)
    assert_same_weights(results["w1_micro4"][0], base, ATOL)
    # Four micro-batches per rank accumulated on gathered weights, one reduce-scatter: the same step.
    assert_same_weights(results["w2_micro1_gather_once"][0], base, ATOL)
    for name in ("w2_micro1", "w1_micro4", "w2_micro1_gather_once"):
        metrics = results[name][1]
        assert metrics["actor/pg_loss"] == pytest.approx(base_metrics["actor/pg_loss"], abs=1e-6)
        assert metrics["actor/clip_frac"] == pytest.approx(base_metrics["actor/clip_frac"], abs=1e-6)


@pytest.fixture(scope="module")
def fresh_pair(ray_cluster, policy_dir):
    """A 2-rank group at the policy's initial weights (mini-batches of `ROWS`, micro-batches of 2). One
    test trains it; the other only has a batch refused before it reaches the ranks."""
    config = adam_actor(ppo_mini_batch_size=ROWS, ppo_micro_batch_size=2)
    group, pool = actor_group(policy_dir, 2, config, name="pair")
    yield group
    group.hosts.shutdown()
    pool.release()


def test_uneven_batch_is_refused_for_training(fresh_pair):
    # Refused on the controller, before anything reaches the ranks: the group's weights stay as they were.
    with pytest.raises(ValueError, match="does not split evenly over 2"):
        fresh_pair.update_actor(training_batch(3, seed=1), temperature=1.0)


def test_checkpoint_resume_and_hf_export(ray_cluster, policy_dir, objective, tmp_path):
    config = adam_actor(ppo_mini_batch_size=4, ppo_micro_batch_size=2)
    first, second = training_batch(ROWS, seed=10), training_batch(ROWS, seed=11)
    group, pool = actor_group(policy_dir, 2, config, name="ckpt")
    group.update_actor(first, temperature=1.0, loss_fn=objective)
    group.save_checkpoint(str(tmp_path), export_hf=True)
    at_save = group.gather_full_state()[0]
    uninterrupted_metrics = group.update_actor(second, temperature=1.0, loss_fn=objective)[0]
    uninterrupted = group.gather_full_state()[0]
    group.hosts.shutdown()
    pool.release()

    resumed, pool = actor_group(policy_dir, 2, config, name="resumed")
    try:
        resumed.load_checkpoint(str(tmp_path))
        resumed_metrics = resumed.update_actor(second, temperature=1.0, loss_fn=objective)[0]
        assert_same_weights(resumed.gather_full_state()[0], uninterrupted, 0.0)
        # All but the process's memory high-water mark, which a fresh process reaches differently.
        resumed_metrics.pop("memory/actor_process_peak_mb")
        uninterrupted_metrics.pop("memory/actor_process_peak_mb")
        assert resumed_metrics == uninterrupted_metrics
    finally:
        resumed.hosts.shutdown()
        pool.release()

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    reference = load_causal_lm(policy_dir)
    reference.load_state_dict(at_save)
    ids = first["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, reference(ids).logits, rtol=0, atol=0)
        assert not torch.equal(load_causal_lm(policy_dir)(ids).logits, reference(ids).logits)


def test_unknown_loss_names_fail_on_the_controller():
    with pytest.raises(UnknownNameError, match=r"valid choices: .*ppo_clip.*did you mean 'ppo_clip'"):
        ActorConfig(policy_loss="ppo_clp").objective()
    with pytest.raises(UnknownNameError, match="unknown loss aggregation mode 'token_mean'"):
        ActorConfig(loss_agg_mode="token_mean").objective()
    with pytest.raises(UnknownNameError, match="unknown kl estimator 'k4'"):
        ActorConfig(kl_estimator="k4").objective()


def test_losses_registered_on_the_controller_reach_the_workers(ray_cluster, policy_dir):
    """A policy loss, aggregation mode and KL estimator registered in this (driver) process only, as a
    recipe script run as ``__main__`` registers them, drive ``update_actor`` in the worker processes."""

    # Defined in the test function: the worker processes cannot import them, so they reach the workers
    # only by value with the pickled config, like the functions of a recipe's ``__main__``.
    def position_weighted(
        loss_mat, mask, *, global_token_count=None, global_seq_count=None, norm_constant=None
    ):
        weights = torch.arange(1, loss_mat.shape[-1] + 1, dtype=loss_mat.dtype)
        count = global_token_count if global_token_count is not None else mask.sum()
        return (loss_mat * weights * mask).sum() / count

    def linear_pg(log_prob, old_log_prob, advantages, response_mask, *, scale=1.0, loss_agg_mode, **counts):
        loss = aggregate_loss(-scale * advantages * log_prob, response_mask, loss_agg_mode, **counts)
        return loss, {"marker": masked_mean(torch.full_like(log_prob, 7.0), response_mask)}

    def abs_kl(log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).abs()

    names = ("test_actor_update.linear_pg", "test_actor_update.position_weighted", "test_actor_update.abs_kl")
    register_policy_loss(names[0])(linear_pg)
    register_aggregation_mode(names[1])(position_weighted)
    register_kl_estimator(names[2])(abs_kl)
    try:
        config = adam_actor(
            ppo_mini_batch_size=ROWS,
            ppo_micro_batch_size=2,
            policy_loss=names[0],
            policy_loss_kwargs={"scale": 2.0},
            loss_agg_mode=names[1],
            use_kl_loss=True,
            kl_loss_coef=0.5,
            kl_estimator=names[2],
        )
        objective = config.objective()
    finally:
        # The objective carries the functions from here on; the registries are left as they were.
        POLICY_LOSSES.unregister(names[0])
        AGGREGATION_MODES.unregister(names[1])
        KL_ESTIMATORS.unregister(names[2])

    batch = training_batch(ROWS, seed=4)
    generator = torch.Generator().manual_seed(5)
    ref_log_probs = batch["old_log_probs"] + 0.3 * torch.randn(
        batch["old_log_probs"].shape, generator=generator
    )
    batch = batch | Batch({"ref_log_probs": ref_log_probs * batch["response_mask"]})

    group, pool = actor_group(policy_dir, 2, config, name="registered", objective=objective)
    try:
        metrics = group.update_actor(batch, temperature=1.0)[0]
        updated = group.gather_full_state()[0]
    finally:
        group.hosts.shutdown()
        pool.release()

    expected, expected_metrics, log_probs = reference_step_with_metrics(policy_dir, batch, objective)
    # By hand: the position-weighted sum over valid tokens, over the batch's valid-token count.
    mask = batch["response_mask"].float()
    weights = torch.arange(1, mask.shape[1] + 1, dtype=torch.float32)
    tokens = mask.sum()
    pg_loss = (-2.0 * batch["advantages"] * log_probs * weights * mask).sum() / tokens
    kl_loss = ((log_probs - batch["ref_log_probs"]).abs() * weights * mask).sum() / tokens
    assert expected_metrics["actor/pg_loss"] == pytest.approx(pg_loss.item(), rel=1e-5)
    assert metrics["actor/pg_loss"] == pytest.approx(pg_loss.item(), rel=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(kl_loss.item(), rel=1e-5)
    assert metrics["actor/marker"] == pytest.approx(7.0)
    assert "actor/clip_frac" not in metrics

    default_step = reference_step(policy_dir, batch, PolicyObjective(kl_loss_coef=0.5))
    apart = max((expected[k] - default_step[k]).abs().max().item() for k in expected)
    assert apart > MOVED, "the registered loss must move the weights unlike the default one"
    assert_same_weights(updated, expected, ATOL)


def without_old_log_probs(batch: Batch) -> Batch:
    batch.pop("old_log_probs")
    return batch


def test_on_policy_update_takes_old_log_probs_from_its_own_forward(fresh_pair, policy_dir, objective):
    """Without ``old_log_probs`` the single optimizer step equals the reference step whose old log-probs
    are the policy's own (ratio 1), and the update reports the rollout-vs-trainer gap itself."""
    on_policy = without_old_log_probs(training_batch(ROWS, seed=4))
    current = sequence_log_probs(
        load_causal_lm(policy_dir), on_policy, temperature=1.0, use_packing=False, chunk_size=None
    ).log_probs.detach()
    expected = reference_step(policy_dir, on_policy | Batch({"old_log_probs": current}), objective)
    # The engine's log-probs, off by exactly 0.01 on the first half of the rows and 0.03 on the rest.
    offsets = torch.where(torch.arange(ROWS)[:, None] < ROWS // 2, 0.01, 0.03) * on_policy["response_mask"]
    mask = on_policy["response_mask"].bool()
    metrics = fresh_pair.update_actor(
        on_policy | Batch({"rollout_log_probs": current + offsets}), temperature=1.0, loss_fn=objective
    )[0]
    assert_same_weights(fresh_pair.gather_full_state()[0], expected, ATOL)
    assert metrics["actor/clip_frac"] == 0.0
    assert metrics["sync/log_prob_abs_diff_max"] == pytest.approx(0.03, abs=1e-5)
    assert metrics["sync/log_prob_abs_diff_mean"] == pytest.approx(offsets[mask].mean().item(), abs=1e-5)
    with pytest.raises(WorkerError, match=r"ValueError: .* only valid for one on-policy optimizer step"):
        fresh_pair.update_actor(
            without_old_log_probs(training_batch(2 * ROWS, seed=5)), temperature=1.0, loss_fn=objective
        )
