"""One-step-off-policy GRPO (``async_rollout.max_staleness: 1``) on a rollout pool of its own, stopped
and resumed while a batch is in flight.

One run: the target-character task of the trainer tests, the HF engine on a pool of 1 slot, the actor
on 1 slot, 4 steps, fp32, a checkpoint every 2 steps. It stops after step 2, when step 3's batch is
already generating on the pool, and a new runtime resumes it from that checkpoint for steps 3 and 4.
The step function keeps each step's prompts, rollouts and the actor's weights before its update (the
weights of version ``step - 1``).

By hand: step 1 has nothing generated ahead, so its batch is sampled on version 0 and trained at
version 0 (staleness 0). Step 1 admits step 2's batch before its update, on version 0; step 2 trains
it at version 1 (staleness 1) and admits step 3's on version 1. The checkpoint of step 2 does not count
that batch as handed out, so the resumed run samples step 3's prompts again, on version 2 (staleness 0),
and admits step 4's on version 2 (staleness 1 at step 4). The prompts trained are the data order's, none
lost or repeated across the resume. The rows of each step must be what an engine on the weights of
their version samples for the step's prompts with the step's seed: the pipelining changes when a batch
is generated, not what.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.data import PromptLoader
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from hybridflow.rollout.factory import build_rollout_engine
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.config import derive_sizes, derive_values
from trainer.fit import StopAt, fit
from trainer.runtime import Runtime
from trainer.steps import generate, sampling_params

STEPS = 4
ONE_STEP_OFF = [
    "actor.param_dtype=float32",
    "resource.slots_per_node=1",
    "data.train_batch_size=8",
    "actor.ppo_mini_batch_size=64",
    "actor.ppo_micro_batch_size=32",
    "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
    "resource.placement={rollout: rollout_pool}",
    "async_rollout.max_staleness=1",
    "trainer.save_every=2",
]
VERSIONS = [0, 0, 2, 2]
"""The policy version of each step's rows (module docstring)."""


@pytest.fixture(scope="module")
def run(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("one_step_off"))
    config = run_config(root, "hf", STEPS, [*ONE_STEP_OFF, f"trainer.output_dir={root / 'run'}"])
    prompts: list[Batch] = []
    rollouts: list[Batch] = []
    weights: list[dict[str, torch.Tensor]] = []

    def step(runtime: Runtime, batch: Batch) -> Batch:
        weights.append(runtime.actor.gather_full_state()[0])  # version runtime.step - 1
        prompts.append(batch)
        rollouts.append(rl_step(runtime, batch))
        return rollouts[-1]

    with Runtime(config) as runtime:
        fit(runtime, step, stop=StopAt(steps=2))  # step 3's batch is in flight when this one stops
        assert len(runtime.rollouts_ahead) == 1
        refusals = []
        head = runtime.prompts.peek(0)  # the batch in flight
        for wrong, sampling in ((runtime.prompts.peek(1), None), (head, sampling_params(runtime, 4))):
            with pytest.raises(ValueError) as refused:
                generate(runtime, wrong, sampling)
            refusals.append(str(refused.value))
    with Runtime(config) as runtime:
        fit(runtime, step)
        model_dir, data = runtime.model_dir, runtime.train_data
        pad_id = runtime.tokenizer.pad_token_id
        seeds = [sampling_params(runtime, s) for s in range(1, STEPS + 1)]
    return {
        "config": config,
        "model_dir": model_dir,
        "data": data,
        "pad_id": pad_id,
        "prompts": prompts,
        "rollouts": rollouts,
        "weights": weights,
        "sampling": seeds,
        "log": read_jsonl(root / "run" / "metrics.jsonl"),
        "refusals": refusals,
    }


def test_rows_carry_the_version_the_engine_served(run):
    versions = [r["policy_version"].unique().tolist() for r in run["rollouts"]]
    assert versions == [[v] for v in VERSIONS]


def test_staleness_stays_within_one_and_is_zero_where_nothing_was_ahead(run):
    log = run["log"]
    assert [record["step"] for record in log] == [1, 2, 3, 4]
    staleness = [step - 1 - version for step, version in enumerate(VERSIONS, start=1)]
    assert staleness == [0, 1, 0, 1]
    assert [record["async/staleness_max"] for record in log] == staleness
    assert [record["async/staleness_mean"] for record in log] == staleness
    for record, rollouts, stale in zip(log, run["rollouts"], staleness, strict=True):
        tokens = float(rollouts["response_mask"].sum())
        expected = (0.0, tokens) if stale else (tokens, 0.0)
        assert (record["async/tokens_staleness_0"], record["async/tokens_staleness_1"]) == expected
        assert record["async/trainer_wait_s"] >= 0 and record["async/pool_generate_s"] > 0
    # One batch ahead while another step follows; none past the last step.
    assert [record["async/in_flight"] for record in log] == [1, 1, 1, 0]


def test_prompts_follow_the_data_order_across_the_resume(run):
    config = run["config"].data
    loader = PromptLoader(run["data"], config.train_batch_size, run["pad_id"], seed=config.seed, shuffle=config.shuffle)
    expected = [list(batch["index"]) for batch, _ in zip(loader, range(STEPS), strict=False)]
    trained = [list(batch["index"]) for batch in run["prompts"]]
    assert trained == expected
    # Each step's rows answer that step's prompts.
    for batch, rollouts in zip(run["prompts"], run["rollouts"], strict=True):
        n = len(rollouts) // len(batch)
        assert list(rollouts["index"]) == [i for i in batch["index"] for _ in range(n)]


def test_each_batch_is_what_the_engine_on_its_version_samples(run):
    config = run["config"]
    engine_values = derive_values(config, derive_sizes(config), STEPS, run["model_dir"]).actor.engine
    engine = build_rollout_engine(config.rollout, run["model_dir"], engine_values, device="cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the pool's engine computes
    try:
        for step, version in enumerate(VERSIONS, start=1):
            engine.update_weights(iter(run["weights"][version].items()))
            expected = engine.generate(run["prompts"][step - 1], run["sampling"][step - 1])
            got = run["rollouts"][step - 1]
            assert torch.equal(got["responses"], expected["responses"]), f"step {step}"
            assert torch.equal(got["response_mask"], expected["response_mask"]), f"step {step}"
            torch.testing.assert_close(got["rollout_log_probs"], expected["rollout_log_probs"], rtol=0, atol=1e-5)
        # The synchronous choice, the newest weights (version step - 1), samples other rows: the check
        # above tells the versions apart.
        engine.update_weights(iter(run["weights"][STEPS - 1].items()))
        newest = engine.generate(run["prompts"][-1], run["sampling"][-1])
        assert not torch.equal(newest["rollout_log_probs"], run["rollouts"][-1]["rollout_log_probs"])
    finally:
        torch.set_num_threads(threads)


def test_a_step_cannot_bring_its_own_prompts_or_sampling_while_a_batch_is_in_flight(run):
    other_prompts, other_sampling = run["refusals"]
    assert "passed a batch the rollout pool was not given (the pool holds the batch of step 3 next)" in other_prompts
    assert "the pool started step 3's batch with" in other_sampling
