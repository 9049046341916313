"""`fit` with a step function written in the test: checkpoint/resume, the sync check, a recipe's worker class,
the stop and evaluation hooks.

Real Ray, gloo, FSDP2 and the HF engine on one rank (what `fit` does is the driver's: a rank more is only
a worker process more to start; 2-rank runs resume in test_end_to_end), on the tiny "write the character
7" task of `tests.trainer._runs`. The step below is not one the library ships (REINFORCE with a leave-one-out
baseline, computed here), so everything `fit` does for it, it does for any step.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.contract import MODEL_INPUTS
from hybridflow.controller import register
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from tests.trainer._runs import run_config, write_task
from trainer.fit import Every, LogProbGapError, Progress, StopAt, fit
from trainer.runtime import Runtime
from trainer.steps import TRANSFER_METRIC, generate, old_log_probs, score, update_actor
from workers.actor import ActorRolloutRefWorker

STEPS = 3
ONE_RANK = "resource.slots_per_node=1"


class ColumnRecordingActor(ActorRolloutRefWorker):
    """A recipe-style worker class: records which columns each update received."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.update_columns: list[list[str]] = []

    def update_actor(self, batch: Batch, **kwargs) -> dict[str, float]:
        self.update_columns.append(sorted(batch.keys()))
        return super().update_actor(batch, **kwargs)

    @register(dispatch="rank_zero")
    def columns_seen_by_updates(self) -> list[list[str]]:
        return self.update_columns


def leave_one_out_advantages(rollouts: Batch) -> torch.Tensor:
    """``[batch, response_len]``: score minus the mean score of the other samples of the same prompt."""
    scores, groups = rollouts["scores"], rollouts["group_ids"]
    sums = torch.zeros(int(groups.max()) + 1).index_add_(0, groups, scores)
    counts = torch.zeros_like(sums).index_add_(0, groups, torch.ones_like(scores))
    baseline = (sums[groups] - scores) / (counts[groups] - 1)
    return (scores - baseline)[:, None] * rollouts["response_mask"]


def loo_step(runtime: Runtime, prompts: Batch) -> Batch:
    rollouts = generate(runtime, prompts)
    rollouts |= score(runtime, rollouts)
    rollouts |= old_log_probs(runtime, rollouts)
    rollouts |= Batch({"advantages": leave_one_out_advantages(rollouts)})
    update_actor(runtime, rollouts)
    return rollouts


def stale_engine_step(runtime: Runtime, prompts: Batch) -> Batch:
    """As `loo_step`, but the engine's log-probs are off by 0.5 nats: what a failed weight push looks like."""
    rollouts = generate(runtime, prompts)
    engine = rollouts.pop("rollout_log_probs")["rollout_log_probs"]
    rollouts |= Batch({"rollout_log_probs": engine + 0.5 * rollouts["response_mask"]})
    rollouts |= score(runtime, rollouts)
    rollouts |= old_log_probs(runtime, rollouts)
    return rollouts


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("fit"))


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, task):
    config = run_config(task, "hf", STEPS, [ONE_RANK, "trainer.save_every=2", "actor.param_dtype=float32"])
    sent: list[tuple[float, Batch, Batch]] = []

    def recorded_step(runtime: Runtime, prompts: Batch) -> Batch:
        rollouts = loo_step(runtime, prompts)
        sent.append((runtime.step_metrics[TRANSFER_METRIC], prompts, rollouts))
        return rollouts

    with Runtime(config, worker_classes={"actor_rollout": ColumnRecordingActor}) as runtime:
        fit(runtime, recorded_step)
        seen = runtime.actor.columns_seen_by_updates()
        used_class = runtime.actor.worker_cls
    return read_jsonl(task / "run" / "metrics.jsonl"), seen, used_class, sent


def test_a_custom_step_resumes_and_reproduces_the_next_step(task, uninterrupted):
    records, _, _, _ = uninterrupted
    assert [r["step"] for r in records] == [1, 2, 3]
    assert (task / "run" / "checkpoints" / "step_2").is_dir()
    for record in records:
        # fit computed the sync gap of a step it knows nothing about, and timed its phases.
        assert record["sync/log_prob_abs_diff_max"] < 1e-3
        for key in ("timing_s/generation", "timing_s/reward", "timing_s/log_prob", "timing_s/update"):
            assert record[key] > 0, key
    config = run_config(
        task,
        "hf",
        STEPS,
        [
            ONE_RANK,
            "actor.param_dtype=float32",
            f"trainer.resume={task / 'run' / 'checkpoints' / 'step_2'}",
            f"trainer.output_dir={task / 'resumed'}",
        ],
    )
    with Runtime(config) as runtime:
        fit(runtime, loo_step)
    resumed = read_jsonl(task / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [3]
    for key in ("score/mean", "response_length/mean", "advantage/mean", "actor/pg_loss", "actor/grad_norm"):
        assert resumed[0][key] == pytest.approx(records[2][key], rel=1e-5, abs=1e-7), key


def test_the_recipe_worker_class_runs_the_actor_role(uninterrupted):
    _, seen, used_class, _ = uninterrupted
    assert used_class is ColumnRecordingActor
    # Its override ran on every update (rank 0 records its share), with exactly the columns sent: the
    # token columns travel with the batch.
    assert seen == [sorted([*MODEL_INPUTS, "advantages", "old_log_probs"])] * STEPS


def test_to_actor_bytes_count_the_prompts_and_every_column_sent(uninterrupted):
    records, _, _, sent = uninterrupted
    assert len(sent) == STEPS
    for (measured, prompts, rollouts), record in zip(sent, records, strict=True):
        computed = rollouts.select("advantages", "old_log_probs").nbytes()
        # The prompts, then the token columns for the log-prob pass and again for the update with what
        # the controller computed.
        assert measured == prompts.nbytes() + 2 * rollouts.select(*MODEL_INPUTS).nbytes() + computed
        assert record[TRANSFER_METRIC] == measured


def test_the_sync_check_fires_for_any_step_function(ray_cluster, task):
    config = run_config(
        task, "hf", 2, [ONE_RANK, "resharding.max_log_prob_gap=0.1", f"trainer.output_dir={task / 'stale'}"]
    )
    with Runtime(config) as runtime, pytest.raises(LogProbGapError, match=r"step 1: .* gap 0\.5"):
        fit(runtime, stale_engine_step)


def test_a_worker_class_must_subclass_the_shipped_one_and_name_a_started_role(ray_cluster, task):
    config = run_config(task, "hf", 1, [ONE_RANK, f"trainer.output_dir={task / 'bad'}"])
    with pytest.raises(ValueError, match=r"worker_classes\['actor_rollout'\].*subclass of workers\.actor"):
        Runtime(config, worker_classes={"actor_rollout": ColumnRecordingActor.__mro__[-1]})
    with pytest.raises(ValueError, match=r"names role\(s\) \['critic'\] that this run does not start"):
        Runtime(config, worker_classes={"critic": ColumnRecordingActor})


def test_fit_stops_at_the_step_that_reaches_the_token_budget_and_evaluates_there(ray_cluster, task, uninterrupted):
    records, _, _, sent = uninterrupted
    # Every row loo_step generates comes back in its rollouts: a step's generated tokens, by hand.
    by_hand = [float(rollouts["response_mask"].sum()) for _, _, rollouts in sent]
    assert [r["response/generated_tokens"] for r in records] == by_hand
    # One token more than step 1 generated: reached during step 2 (same seeds, same tokens), of 3 steps.
    budget = by_hand[0] + 1
    config = run_config(
        task, "hf", STEPS, [ONE_RANK, "actor.param_dtype=float32", f"trainer.output_dir={task / 'stopped'}"]
    )
    seen: list[Progress] = []

    def evaluate(runtime: Runtime, progress: Progress) -> dict[str, float]:
        seen.append(progress)
        return {"eval/tokens_so_far": progress.generated_tokens}

    with Runtime(config) as runtime:
        last = fit(
            runtime, loo_step, stop=StopAt(generated_tokens=budget), evaluate=evaluate, evaluate_every=Every(steps=1)
        )
    stopped = read_jsonl(task / "stopped" / "metrics.jsonl")
    assert [r["step"] for r in stopped] == [1, 2]
    assert [(p.steps, p.generated_tokens) for p in seen] == [(1, by_hand[0]), (2, by_hand[0] + by_hand[1])]
    assert [r["eval/tokens_so_far"] for r in stopped] == [by_hand[0], by_hand[0] + by_hand[1]]
    assert last == {"eval/tokens_so_far": by_hand[0] + by_hand[1]}
    assert seen[1].seconds == pytest.approx(stopped[1]["time/training_s"])
    assert stopped[1]["time/training_s"] == pytest.approx(stopped[0]["timing_s/step"] + stopped[1]["timing_s/step"])
