"""Rollouts kept on the actor workers: `generate_sequences(keep=...)` and the methods that take
``rollout_ids`` in place of the token columns, on 2 real Ray + gloo ranks with the HF engine.

Each call by ids is compared with the same call given the full columns, which is what the controller
sent before the rollouts were kept.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import WorkerError
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from tests.workers._policy import actor_group, adam_actor, vllm_rollout, write_policy
from workers.actor import MODEL_INPUTS
from workers.rollout_store import RolloutKeep

PROMPTS = 4
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3)
ROWS = PROMPTS * SAMPLING.n
FIRST_ID = 100
PAD = 0


def prompts() -> Batch:
    """Left-padded prompts of 2-5 tokens, with a non-tensor column the engine carries along."""
    lengths = torch.tensor([5, 2, 4, 3])
    mask = (torch.arange(5) >= 5 - lengths[:, None]).long()
    ids = (4 + torch.arange(20).view(4, 5) % 20) * mask
    return Batch(
        {"input_ids": ids, "attention_mask": mask}, {"raw_prompt": [f"p{i}" for i in range(PROMPTS)]}
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape
    assert (actual - expected).abs().max().item() <= 1e-6


@pytest.fixture(scope="module")
def group(ray_cluster, tmp_path_factory):
    policy = write_policy(tmp_path_factory.mktemp("kept_policy"), seed=4)
    config = adam_actor(ppo_mini_batch_size=ROWS, ppo_micro_batch_size=2)
    group, pool = actor_group(policy, 2, config, name="kept")
    yield group
    group.hosts.shutdown()
    pool.release()


@pytest.fixture(scope="module")
def generated(group):
    """The same generation without and with keep (same seed, same weights)."""
    full = group.generate_sequences(prompts(), SAMPLING)
    kept = group.generate_sequences(
        prompts(), SAMPLING, RolloutKeep(step=1, first_id=FIRST_ID, pad_token_id=PAD, rows=ROWS)
    )
    return full, kept


def test_keep_returns_the_response_columns_and_the_row_ids(generated):
    full, kept = generated
    assert sorted(kept.keys()) == sorted(
        [
            "responses",
            "response_mask",
            "rollout_log_probs",
            "response_lengths",
            "finish_reason",
            "rollout_ids",
        ]
    )
    assert kept["rollout_ids"].tolist() == list(range(FIRST_ID, FIRST_ID + ROWS))
    # Same samples as without keep, and the controller rebuilds the rest from its prompts.
    rebuilt = prompts().repeat(SAMPLING.n) | kept.select(
        *[k for k in kept.keys() if k != "rollout_ids"], meta=False
    )
    assert rebuilt.equals(full.select(*full.keys(), meta=False))
    assert full["response_lengths"].float().mean() > 1  # real samples, not empty ones


def test_log_probs_by_ids_equal_log_probs_of_the_full_columns(group, generated):
    full, kept = generated
    expected = group.compute_log_prob(full.select(*MODEL_INPUTS, meta=False), temperature=1.0)[
        "old_log_probs"
    ]
    ids = kept["rollout_ids"]
    by_ids = group.compute_log_prob(Batch({"rollout_ids": ids}), temperature=1.0)["old_log_probs"]
    assert_close(by_ids, expected)
    # Reversed, each rank gets the other rank's generated rows: every rank holds the whole call.
    reversed_ = group.compute_log_prob(Batch({"rollout_ids": ids.flip(0)}), temperature=1.0)["old_log_probs"]
    assert_close(reversed_, expected.flip(0))
    assert (expected[0] - expected[-1]).abs().max() > 1e-3  # the rows differ, so an order mix-up shows
    ref = group.compute_ref_log_prob(Batch({"rollout_ids": ids}), temperature=1.0)["ref_log_probs"]
    assert_close(ref, expected)  # the reference is the initial policy, not updated yet


def test_a_sent_held_column_wins_over_the_kept_one(group, generated):
    full, kept = generated
    mask = full["response_mask"].clone()
    mask[:, 2:] = 0  # what a recipe's overlong filter or length cap does on the controller
    masked = full.select("input_ids", "attention_mask", "responses", meta=False)
    expected = group.compute_log_prob(masked | Batch({"response_mask": mask}), temperature=1.0)[
        "old_log_probs"
    ]
    unmasked = group.compute_log_prob(full.select(*MODEL_INPUTS, meta=False), temperature=1.0)[
        "old_log_probs"
    ]
    assert (expected - unmasked).abs().max() > 1e-3
    sent = Batch({"rollout_ids": kept["rollout_ids"], "response_mask": mask})
    assert_close(group.compute_log_prob(sent, temperature=1.0)["old_log_probs"], expected)


def test_an_update_by_ids_equals_the_update_on_the_full_columns(group, generated, tmp_path):
    full, kept = generated
    generator = torch.Generator().manual_seed(0)
    advantages = torch.randn(ROWS, generator=generator)[:, None] * full["response_mask"]
    sent = Batch({"advantages": advantages, "rollout_log_probs": full["rollout_log_probs"]})
    group.save_checkpoint(str(tmp_path / "before"))
    by_columns = group.update_actor(full.select(*MODEL_INPUTS, meta=False) | sent, temperature=1.0)[0]
    updated = group.gather_full_state()[0]
    group.load_checkpoint(str(tmp_path / "before"))
    by_ids = group.update_actor(Batch({"rollout_ids": kept["rollout_ids"]}) | sent, temperature=1.0)[0]
    assert by_columns["actor/grad_norm"] > 1e-3 and "actor/pg_loss" in by_columns
    assert "sync/log_prob_abs_diff_max" in by_columns  # the engine's log-probs went along, held or not
    assert by_ids.keys() == by_columns.keys()
    for key, value in by_columns.items():
        assert abs(by_ids[key] - value) <= 1e-6, key
    after = group.gather_full_state()[0]
    assert max((after[k] - updated[k]).abs().max().item() for k in updated) <= 1e-6


def test_uneven_calls_of_one_step_keep_only_their_own_rows(group):
    """3 prompts over 2 dp ranks: the batch is padded with a copy of prompt 0, whose samples are not
    returned and not kept, so the step's next call can take the ids that follow the 6 real rows."""
    uneven = prompts()[:3]
    rows = 3 * SAMPLING.n
    first = group.generate_sequences(uneven, SAMPLING, RolloutKeep(step=7, first_id=0, pad_token_id=PAD, rows=rows))
    second = group.generate_sequences(uneven, SAMPLING, RolloutKeep(step=7, first_id=rows, pad_token_id=PAD, rows=rows))
    assert first["rollout_ids"].tolist() == list(range(rows))
    assert second["rollout_ids"].tolist() == list(range(rows, 2 * rows))
    both = Batch.concat([prompts()[:3].repeat(SAMPLING.n) | first, prompts()[:3].repeat(SAMPLING.n) | second])
    expected = group.compute_log_prob(both.select(*MODEL_INPUTS, meta=False), temperature=1.0)["old_log_probs"]
    by_ids = group.compute_log_prob(Batch({"rollout_ids": both["rollout_ids"]}), temperature=1.0)["old_log_probs"]
    assert_close(by_ids, expected)


def test_ids_of_an_earlier_step_fail_naming_them(group, generated):
    _, kept = generated
    group.generate_sequences(prompts(), SAMPLING, RolloutKeep(step=2, first_id=0, pad_token_id=PAD, rows=ROWS))
    with pytest.raises(WorkerError, match=r"KeyError: .*no rollout rows held for ids \[10[0-7], "):
        group.compute_log_prob(Batch({"rollout_ids": kept["rollout_ids"]}), temperature=1.0)


def test_tensor_parallel_ranks_keep_their_group_s_rows_once(ray_cluster, tmp_path):
    """vLLM at tp=2: one dp group of two ranks that generate the same rows; each is kept once."""
    policy = write_policy(tmp_path / "policy", seed=4)
    config = adam_actor(ppo_mini_batch_size=ROWS, ppo_micro_batch_size=2)
    group, pool = actor_group(policy, 2, config, vllm_rollout(2), name="kept-tp2")
    try:
        first = group.generate_sequences(
            prompts(), SAMPLING, RolloutKeep(step=1, first_id=0, pad_token_id=PAD, rows=ROWS)
        )
        # A second call of the same step continues the ids: had a tp rank's copy been kept too, the
        # first call would have taken ids 0..2*ROWS-1 and this one would collide with them.
        second = group.generate_sequences(
            prompts(), SAMPLING, RolloutKeep(step=1, first_id=ROWS, pad_token_id=PAD, rows=ROWS)
        )
        assert first["rollout_ids"].tolist() == list(range(ROWS))
        assert second["rollout_ids"].tolist() == list(range(ROWS, 2 * ROWS))
        rows = Batch.concat([first, second])
        full = prompts().repeat(SAMPLING.n).select(*MODEL_INPUTS[:2])
        columns = Batch.concat([full, full]) | rows.select("responses", "response_mask", meta=False)
        expected = group.compute_log_prob(columns, temperature=1.0)["old_log_probs"]
        by_ids = group.compute_log_prob(rows.select("rollout_ids", meta=False), temperature=1.0)[
            "old_log_probs"
        ]
        assert_close(by_ids, expected)
        assert (by_ids - rows["rollout_log_probs"]).abs()[rows["response_mask"].bool()].mean() < 1e-3
    finally:
        group.hosts.shutdown()
        pool.release()
