"""`CriticWorker` on FSDP2 over real Ray + gloo ranks, against single-process references.

One group of two ranks holds three critics (packed; padded with token-budget micro-batches; and one
whose loss aggregation was registered in this process only); every test reads the results of the same
sequence of calls.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridflow.algos import AGGREGATION_MODES, clipped_value_loss, register_aggregation_mode
from hybridflow.algos.aggregation import AggregationMode
from hybridflow.controller import ResourcePool, RoleSpec, create_colocated_worker_groups
from hybridflow.protocol import Batch
from tests.workers._policy import training_batch, write_policy
from workers.config import CriticConfig, CriticDerived
from workers.critic import CriticWorker, TokenHeadModel, load_value_model

ROWS = 8
ADAM = CriticConfig(lr=1e-3, grad_clip=1.0)
CLIP = 0.2
# fp32 sums in another order (per rank, per micro-batch, packed vs padded) moved values by 9e-8 and
# weights by 3e-6 (Adam's first step divides tiny gradients by their own size); a wrong position,
# normaliser or missed gradient moves values by ~1e-2 and weights by ~lr = 1e-3.
ATOL = 1e-5
LEARNING_STEPS = 6


def critic_args(policy_dir, **overrides) -> tuple[CriticConfig, CriticDerived]:
    """The critic section (``ADAM`` and the batching below, with ``overrides``) and its derived values:
    the backbone in ``policy_dir``, the aggregation its ``loss_agg_mode`` names, seed 7."""
    base = dict(
        lr=ADAM.lr,
        grad_clip=ADAM.grad_clip,
        # fp32 compute: the default picks bf16 on CPUs with bf16 units, and the comparisons are exact.
        param_dtype="float32",
        ppo_mini_batch_size=ROWS,
        ppo_micro_batch_size=2,
        forward_micro_batch_size=3,
        cliprange_value=CLIP,
    )
    config = CriticConfig(**(base | overrides))
    derived = CriticDerived(
        model_path=str(policy_dir), aggregation=AGGREGATION_MODES.get(config.loss_agg_mode), seed=7
    )
    return config, derived


def row_values(model: TokenHeadModel, batch: Batch) -> torch.Tensor:
    """Reference values ``[batch, response_len]``: every row alone and unpadded, and the value of
    response token ``t`` read at the token before it. Differentiable."""
    response_len = batch["responses"].shape[1]
    rows = []
    for i in range(len(batch)):
        prompt = batch["input_ids"][i][batch["attention_mask"][i].bool()]
        n = int(batch["response_mask"][i].sum())
        ids = torch.cat([prompt, batch["responses"][i, :n]]).unsqueeze(0)
        per_token = model.head(model.model(input_ids=ids).last_hidden_state[0]).squeeze(-1)
        rows.append(F.pad(per_token[len(prompt) - 1 : len(prompt) - 1 + n], (0, response_len - n)))
    return torch.stack(rows)


def update_inputs(policy_dir, batch: Batch) -> Batch:
    """Old values outside the clip range of the current ones at every token, and returns near them.

    Inside the range the clipped and unclipped terms are equal up to rounding, and which one a token
    counts as is then decided by the last bit; outside it the clip fraction is a stable number.
    """
    with torch.no_grad():
        current = row_values(load_value_model(str(policy_dir), seed=7), batch)
    generator = torch.Generator().manual_seed(1)
    mask = batch["response_mask"]
    sign = torch.randint(0, 2, current.shape, generator=generator) * 2 - 1
    offset = CLIP + 0.1 + 0.2 * torch.rand(current.shape, generator=generator)
    old = (current + sign * offset) * mask
    returns = (current + 0.5 * torch.randn(current.shape, generator=generator)) * mask
    return batch | Batch({"values": old, "returns": returns})


def reference_step(
    policy_dir, batch: Batch, aggregation: AggregationMode = "token-mean"
) -> tuple[dict[str, torch.Tensor], float, float]:
    """The same update in this process, on the full batch at once: weights, loss and clip fraction."""
    model = load_value_model(str(policy_dir), seed=7).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=ADAM.lr, betas=ADAM.betas, weight_decay=ADAM.weight_decay
    )
    values = row_values(model, batch)
    loss, metrics = clipped_value_loss(
        values,
        batch["values"],
        batch["returns"],
        batch["response_mask"],
        cliprange_value=CLIP,
        loss_agg_mode=aggregation,
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), ADAM.grad_clip)
    optimizer.step()
    weights = {k: v.detach() for k, v in model.state_dict().items()}
    return weights, loss.item(), metrics["clip_frac"].item()


def largest_difference(actual: dict, expected: dict) -> float:
    assert actual.keys() == expected.keys()
    return max((actual[k] - expected[k]).abs().max().item() for k in expected)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("critic_backbone"), seed=3)


def registered_aggregation_args(policy_dir) -> tuple[CriticConfig, CriticDerived]:
    """A config whose ``loss_agg_mode`` names an aggregation registered in this process only, as a
    recipe script run as ``__main__`` registers one; the name is unregistered again before any worker
    sees the config.

    The aggregation weights token ``t`` by ``t + 1`` over the valid-token count. Defined in this
    function, the worker processes cannot import it: it reaches them only by value with the config.
    """

    def position_weighted(
        loss_mat, mask, *, global_token_count=None, global_seq_count=None, norm_constant=None
    ):
        weights = torch.arange(1, loss_mat.shape[-1] + 1, dtype=loss_mat.dtype, device=loss_mat.device)
        count = global_token_count if global_token_count is not None else mask.sum()
        return (loss_mat * weights * mask).sum() / count

    name = "test_critic.position_weighted"
    register_aggregation_mode(name)(position_weighted)
    try:
        return critic_args(policy_dir, loss_agg_mode=name)
    finally:
        AGGREGATION_MODES.unregister(name)


@pytest.fixture(scope="module")
def run(ray_cluster, policy_dir, tmp_path_factory):
    """Values, checked steps, a learning run and a checkpoint round trip on one 2-rank group."""
    pool = ResourcePool([2], cpus_per_slot=0.5, name="critic")
    registered_args = registered_aggregation_args(policy_dir)
    roles = {
        "packed": RoleSpec(CriticWorker, critic_args(policy_dir)),
        "padded": RoleSpec(
            CriticWorker,
            critic_args(policy_dir, use_packing=False, dynamic_batching=True, max_tokens_per_micro_batch=24),
        ),
        "registered": RoleSpec(CriticWorker, registered_args),
    }
    groups = create_colocated_worker_groups(pool, roles, name="critic")
    packed, padded, registered = groups["packed"], groups["padded"], groups["registered"]
    out = {"registered_args": registered_args}
    try:
        for group in groups.values():
            group.init_model()
        # Seven rows over two ranks: the dispatch pads one row and drops its output again.
        odd = training_batch(7, seed=20)
        out["odd"] = odd
        out["values_packed"] = packed.compute_values(odd)["values"]
        out["values_padded"] = padded.compute_values(odd)["values"]

        step_batch = update_inputs(policy_dir, training_batch(ROWS, seed=0))
        out["step_batch"] = step_batch
        out["step_metrics"] = packed.update_critic(step_batch)[0]
        out["step_weights"] = packed.gather_full_state()[0]
        out["registered_metrics"] = registered.update_critic(step_batch)[0]
        out["registered_weights"] = registered.gather_full_state()[0]

        # A fixed batch with fixed per-row returns; the clip centre is refreshed each step as in PPO.
        learn = training_batch(ROWS, seed=5)
        returns = (
            torch.randn(ROWS, generator=torch.Generator().manual_seed(2))[:, None] * learn["response_mask"]
        )
        targets = Batch({"returns": returns.float()})

        def step() -> dict[str, float]:
            values = padded.compute_values(learn)
            return padded.update_critic(learn | values | targets)[0]

        out["learning"] = [step() for _ in range(LEARNING_STEPS)]

        checkpoint = tmp_path_factory.mktemp("critic_ckpt")
        padded.save_checkpoint(str(checkpoint))
        out["uninterrupted_metrics"] = [step(), step()]
        out["uninterrupted"] = padded.gather_full_state()[0]
        padded.load_checkpoint(str(checkpoint))
        out["resumed_metrics"] = [step(), step()]
        out["resumed"] = padded.gather_full_state()[0]
    finally:
        packed.hosts.shutdown()
        pool.release()
    return out


def test_values_on_two_ranks_equal_a_single_process_forward(run, policy_dir):
    with torch.no_grad():
        expected = row_values(load_value_model(str(policy_dir), seed=7), run["odd"])
    mask = run["odd"]["response_mask"].bool()
    # The head is random, not zero: values vary, and an off-by-one position would show.
    assert expected[mask].std() > 0.05
    for name in ("values_packed", "values_padded"):
        torch.testing.assert_close(run[name], expected, rtol=0, atol=ATOL)
        assert torch.all(run[name][~mask] == 0)


def test_two_rank_step_equals_single_process_step(run, policy_dir):
    expected, loss, clip_frac = reference_step(policy_dir, run["step_batch"])
    start = load_value_model(str(policy_dir), seed=7).state_dict()
    assert largest_difference(expected, start) > 5e-4, "the reference step must move the weights"
    assert largest_difference(run["step_weights"], expected) <= ATOL
    metrics = run["step_metrics"]
    assert metrics["critic/value_loss"] == pytest.approx(loss, abs=1e-6)
    # Both branches of the clipped loss are taken, so both are checked against the reference.
    assert 0.1 < clip_frac < 0.9
    assert metrics["critic/vf_clip_frac"] == pytest.approx(clip_frac, abs=1e-6)
    assert metrics["critic/lr"] == ADAM.lr


def test_value_loss_falls_on_a_fixed_batch(run):
    losses = [m["critic/value_loss"] for m in run["learning"]]
    # Measured: 0.154 -> 0.0070 over six steps (4.5% of the start); a critic that does not learn, or
    # steps the wrong way, stays at or above the start.
    assert losses[-1] < 0.2 * losses[0], losses
    assert all(m["critic/grad_norm"] > 0 for m in run["learning"])


def test_checkpoint_resume_repeats_the_same_updates(run):
    assert largest_difference(run["resumed"], run["uninterrupted"]) == 0.0
    assert run["resumed_metrics"] == run["uninterrupted_metrics"]
    # The resumed steps start from the saved state, not from the state after the extra steps.
    assert (
        run["resumed_metrics"][0]["critic/value_loss"] != run["uninterrupted_metrics"][1]["critic/value_loss"]
    )


def test_an_aggregation_registered_in_the_controller_only_drives_the_worker_step(run, policy_dir):
    batch = run["step_batch"]
    config, derived = run["registered_args"]
    aggregation = derived.aggregation
    assert config.loss_agg_mode not in AGGREGATION_MODES
    expected, loss, _ = reference_step(policy_dir, batch, aggregation)

    # By hand: the clipped loss per token, weighted by position, over the batch's valid-token count.
    with torch.no_grad():
        values = row_values(load_value_model(str(policy_dir), seed=7), batch)
    mask = batch["response_mask"].float()
    clipped = batch["values"] + (values - batch["values"]).clamp(-CLIP, CLIP)
    per_token = 0.5 * torch.maximum((values - batch["returns"]) ** 2, (clipped - batch["returns"]) ** 2)
    positions = torch.arange(1, mask.shape[1] + 1, dtype=torch.float32)
    by_hand = ((per_token * positions * mask).sum() / mask.sum()).item()
    token_mean = ((per_token * mask).sum() / mask.sum()).item()
    assert by_hand > 2 * token_mean, "the registered aggregation must differ from token-mean"
    assert loss == pytest.approx(by_hand, rel=1e-5)
    assert run["registered_metrics"]["critic/value_loss"] == pytest.approx(by_hand, rel=1e-5)

    default_step, _, _ = reference_step(policy_dir, batch)
    assert largest_difference(expected, default_step) > 100 * ATOL, "the aggregation must move the weights"
    assert largest_difference(run["registered_weights"], expected) <= ATOL
