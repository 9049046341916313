"""A GRPO run with the rollout on a pool of its own equals the colocated run (synchronous mode:
``async_rollout.max_staleness: 0``, through the same admission path as generation ahead).

Both runs: the target-character task of the trainer tests, the HF engine, 1 training rank, 3 steps,
fp32 throughout, the same seeds. Split: the engine runs in a pool of 1 slot of its own and takes the
weights over the weight group before each generation. The engines' seeds follow their dp rank (0 in
both), so the same weights must give the same samples: the rollouts, the losses and the final weights
must agree to 1e-6. A wrong push (stale weights, a dropped bucket, a misplaced tensor) would change the
samples of step 2 on, and the weights with them.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.runtime import Runtime

STEPS = 3
COMMON = [
    "actor.param_dtype=float32",
    "resource.slots_per_node=1",
    "data.train_batch_size=8",
    "actor.ppo_mini_batch_size=64",
    "actor.ppo_micro_batch_size=32",
]
SPLIT = [
    "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
    "resource.placement={rollout: rollout_pool}",
    "async_rollout.max_staleness=0",  # the pool generates each step's batch when the step asks for it
]


def _run(root, name: str, extra: list[str]) -> tuple[list[Batch], dict[str, torch.Tensor], list[dict]]:
    config = run_config(root, "hf", STEPS, [*COMMON, *extra, f"trainer.output_dir={root / name}"])
    seen: list[Batch] = []

    def step(runtime: Runtime, prompts: Batch) -> Batch:
        rollouts = rl_step(runtime, prompts)
        seen.append(rollouts)
        return rollouts

    with Runtime(config) as runtime:
        fit(runtime, step)
        weights = runtime.actor.gather_full_state()[0]
    return seen, weights, read_jsonl(root / name / "metrics.jsonl")


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("split_grpo"))
    return _run(root, "colocated", []), _run(root, "split", SPLIT)


def test_split_rollouts_equal_colocated(runs):
    (colocated, _, _), (split, _, _) = runs
    assert len(colocated) == len(split) == STEPS
    for step, (a, b) in enumerate(zip(colocated, split, strict=True), start=1):
        assert torch.equal(a["responses"], b["responses"]), f"step {step}: other samples"
        assert torch.equal(a["response_mask"], b["response_mask"]), f"step {step}"
        torch.testing.assert_close(b["rollout_log_probs"], a["rollout_log_probs"], rtol=0, atol=1e-6)
        # Each step generated from the weights of the updates before it: version = step - 1.
        assert b["policy_version"].tolist() == [step - 1] * len(b), f"step {step}"
    # Learning happened, so later steps did test the pushed weights, not the initial ones.
    assert not torch.equal(colocated[0]["rollout_log_probs"], colocated[-1]["rollout_log_probs"])


def test_split_losses_and_weights_equal_colocated(runs):
    (_, colocated_weights, colocated_log), (_, split_weights, split_log) = runs
    for a, b in zip(colocated_log, split_log, strict=True):
        assert a["step"] == b["step"]
        for key in ("actor/pg_loss", "actor/grad_norm", "score/mean"):
            assert b[key] == pytest.approx(a[key], rel=0, abs=1e-6), (a["step"], key)
    assert colocated_weights.keys() == split_weights.keys()
    for name, value in colocated_weights.items():
        torch.testing.assert_close(split_weights[name], value, rtol=0, atol=1e-6, msg=name)


def test_split_run_reports_each_push(runs):
    _, (_, _, split_log) = runs
    for record in split_log:
        assert record["rollout/policy_version"] == record["step"] - 1
        assert record["weight_push/mb"] > 0
        assert record["weight_push/buckets"] >= 1
        assert "timing_s/weight_push" in record
        # Staleness 0: every token trained on the version the trainer is at, nothing left in flight.
        assert record["async/staleness_max"] == 0 and record["async/in_flight"] == 0
    for before, record in itertools.pairwise(split_log):
        # Synchronous, the pool has no work while the actor updates: its idle seconds before the next
        # generation cover the update (timed by the controller, within the pool's idle window).
        assert record["async/pool_idle_s"] >= before["timing_s/update"] > 0, record["step"]
