"""A token statistic registered in the controller alone reaches the actor's workers by name."""

from __future__ import annotations

import pytest
import torch

from hybridflow.models.io import load_causal_lm
from hybridflow.parallel import TOKEN_STATISTICS, register_token_statistic
from tests.workers._policy import actor_group, adam_actor, training_batch, write_policy
from workers.actor import sequence_log_probs

TEMPERATURE = 0.8


def test_a_statistic_registered_in_the_driver_is_computed_on_two_ranks(ray_cluster, tmp_path):
    # Registered here, inside the test: the worker processes never run this code, so they can only
    # know the statistic through the function the controller resolves and ships.
    @register_token_statistic("logit_margin_for_test")
    def logit_margin(logits, log_norm, labels):
        """Label logit minus the mean logit (nats of temperature-scaled logits)."""
        return logits.gather(-1, labels[:, None])[:, 0] - logits.mean(-1)

    policy = write_policy(tmp_path / "policy")
    batch = training_batch(6, seed=3)
    group, pool = actor_group(policy, 2, adam_actor(forward_micro_batch_size=2, logit_chunk_size=4))
    try:
        out = group.compute_log_prob(
            batch, temperature=TEMPERATURE, stats=["entropy", "logit_margin_for_test"]
        )
        reference = sequence_log_probs(
            load_causal_lm(policy),
            batch,
            temperature=TEMPERATURE,
            use_packing=False,
            chunk_size=None,
            stats=("log_prob", "entropy", "logit_margin_for_test"),
        )
        # An unknown name fails in the controller, listing the registered ones, before anything is sent.
        with pytest.raises(KeyError, match=r"no_such_statistic.*valid choices: entropy, log_prob"):
            group.compute_log_prob(batch, temperature=TEMPERATURE, stats=["no_such_statistic"])
    finally:
        TOKEN_STATISTICS.unregister("logit_margin_for_test")
        group.hosts.shutdown()
        pool.release()
    assert sorted(out.keys()) == ["entropy", "logit_margin_for_test", "old_log_probs"]
    mask = batch["response_mask"].bool()
    for column, name in (("old_log_probs", "log_prob"), ("entropy", "entropy"), ("logit_margin_for_test",) * 2):
        want = reference.values[name] * mask
        torch.testing.assert_close(out[column] * mask, want, atol=1e-5, rtol=0, msg=column)
    assert float(out["logit_margin_for_test"][mask].abs().min()) > 0  # not a column of zeros
