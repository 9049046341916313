"""The ``ref.*`` batching keys reach the reference forward of the actor worker (real Ray + gloo): they
used to be validated but read by nobody."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridflow.controller import WorkerError
from tests.workers._policy import ADAM, actor_group, training_batch, write_policy
from workers.config import RefConfig


def test_reference_forward_batches_by_the_ref_settings(ray_cluster, tmp_path):
    """The reference forward packs by ``ref.max_tokens_per_micro_batch``, not by the actor's
    forward settings: a budget below one row's tokens fails there and only there, and a budget that
    fits gives the initial policy's log-probs (the reference is a copy of it)."""
    policy = write_policy(tmp_path / "policy", seed=5)
    batch = training_batch(4, seed=0).select("input_ids", "attention_mask", "responses", "response_mask")
    actor = dataclasses.replace(ADAM, forward_micro_batch_size=2)
    tight = RefConfig(dynamic_batching=True, max_tokens_per_micro_batch=4)
    group, pool = actor_group(policy, 1, actor, name="ref-tight", ref=tight)
    try:
        policy_log_probs = group.compute_log_prob(batch, temperature=1.0)["old_log_probs"]
        with pytest.raises(WorkerError, match=r"max_tokens_per_micro_batch=4"):
            group.compute_ref_log_prob(batch, temperature=1.0)
    finally:
        group.hosts.shutdown()
        pool.release()
    fitting = RefConfig(forward_micro_batch_size=1, dynamic_batching=True, max_tokens_per_micro_batch=16)
    group, pool = actor_group(policy, 1, ADAM, name="ref-fitting", ref=fitting)
    try:
        ref_log_probs = group.compute_ref_log_prob(batch, temperature=1.0)["ref_log_probs"]
    finally:
        group.hosts.shutdown()
        pool.release()
    torch.testing.assert_close(ref_log_probs, policy_log_probs, atol=1e-6, rtol=0)
