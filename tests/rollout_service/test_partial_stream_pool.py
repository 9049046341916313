"""Partial rollouts streamed on a rollout pool of its own: the round left running while the actor
updates, stopped and resumed with that round in flight.

One run: the settings of test_partial_trainer.py (8 prompts a step, 4 samples each, responses of at most
8 tokens in rounds of 3, ``max_staleness`` 1, a checkpoint every 2 steps) with the HF engine on a pool of
1 slot and the actor on 1 slot, 4 steps. It stops after step 2, while the round step 2 submitted runs on
the pool, and a new runtime resumes from that checkpoint for steps 3 and 4. The step function keeps each
step's rollouts and the actor's weights before its update (those of version ``step - 1``).

By hand, with batches B1..B5 of the data order: step 1 (version 0) starts B1 only (at ``max_staleness``
1 a second batch of version 0 could not all train in step 2), runs rounds until B1 finished, trains it
and submits one round of 3 tokens over B2 on version 0, which runs during step 1's update. Step 2
(version 1) collects it, pushes version 1, runs B2 to the end (started a version ago, so due) and trains
it: each row's first 3 tokens are version 0, the rest version 1. It submits B3's first round on version
1. The checkpoint of step 2 settles that round: it waits for it, keeps B3's samples with the round's 3
tokens of version 1, and counts B3 as handed out and held (its data position is after B3). The resumed
step 3 (version 2) holds B3 again and is handed B4, which it starts itself: one blocking round runs
B3 to the end (due) and gives B4 its first 3 tokens, both on version 2; it trains B3 (3 tokens of
version 1 from the settled round, the rest version 2) and submits a round over B4 and B5's start on
version 2. Step 4 collects it, runs B4 to the end on version 3 and trains it (6 tokens of version 2, the
rest version 3), and leaves B5 in the pool. The last step submits nothing.

A second run, at ``max_staleness`` 2 without a stop, starts two batches in step 1 and leaves prompts
running across steps: every prompt started is trained once or still pending (by id), and every token
stays within 2 versions, its row's versions non-decreasing.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hybridflow.checkpoint import CheckpointStore
from hybridflow.metrics import read_jsonl
from hybridflow.models import load_causal_lm
from hybridflow.protocol import Batch
from hybridflow.rollout.logprobs import response_log_probs
from tests.rollout_service.test_partial_trainer import (
    BATCH,
    PARTIAL,
    N,
    _data_order,
    _trained,
    recording_step,
    run_facts,
    sampled_by_their_versions,
)
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.config import ConfigError
from trainer.fit import StopAt, fit
from trainer.rollout_queue import PARTIAL_FILE
from trainer.runtime import Runtime

STEPS = 4
ROUND = 3
SPLIT = ["resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}", "resource.placement={rollout: rollout_pool}"]
OLDER = {2: (0, ROUND), 3: (1, ROUND), 4: (2, 2 * ROUND)}
"""Per step, the version of its rows' tokens older than ``step - 1`` and how many leading tokens of a row
have it (module docstring): the overlapped rounds, and step 3's settled round."""
COLLECTED = (2, 4)
"""The steps that collect a round left running during the step before (step 3 follows the resume)."""
PENDING_AFTER = [BATCH, BATCH, 2 * BATCH, BATCH]
"""Prompts left in the pool after each step: B2, B3, B4 and B5, B5."""


def expected_versions(step: int, mask: torch.Tensor) -> torch.Tensor:
    """``token_versions`` the schedule implies for step ``step``'s rows (module docstring)."""
    versions = torch.full(mask.shape, step - 1, dtype=torch.long)
    if step in OLDER:
        version, tokens = OLDER[step]
        versions[:, :tokens] = version
    return versions * mask


@pytest.fixture(scope="module")
def run(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("partial_pool"))
    config = run_config(root, "hf", STEPS, [*PARTIAL, *SPLIT, f"trainer.output_dir={root / 'run'}"])
    rollouts: list[Batch] = []
    weights: list[dict[str, torch.Tensor]] = []
    step = recording_step(rollouts, weights)
    with Runtime(config) as runtime:
        fit(runtime, step, stop=StopAt(steps=2))
        pool = runtime.rollouts_ahead.partial
        in_flight = pool.pending
        assert in_flight is not None and in_flight.admitted is runtime.prompts.peek(0)
        store = CheckpointStore(config.trainer.checkpoint_dir)
        stopped = {
            "admitted": [int(i) for i in in_flight.admitted["index"]],
            "version": in_flight.version,
            "groups": [group.index for group in pool.groups],
            "live": [list(group.samples) for group in pool.groups],
            "saved": store.load(store.path_of(2)).state["loader"],
            "kept": torch.load(store.path_of(2) / PARTIAL_FILE, weights_only=True),
            # The round the checkpoint waited for, as the pool returned it (the live pool never collects it).
            "round": [(call.samples, out) for (call, _), out in zip(in_flight.calls, in_flight.outputs(), strict=True)],
        }

    def resumed_step(runtime: Runtime, batch: Batch) -> Batch:
        # The pool as the resume put it back, before the first resumed step continues its samples.
        pool = runtime.rollouts_ahead.partial
        stopped.setdefault("resumed", [(g.index, g.version, copy.deepcopy(g.samples)) for g in pool.groups])
        return step(runtime, batch)

    with Runtime(config) as runtime:
        fit(runtime, resumed_step)
        pool = runtime.rollouts_ahead.partial
        after = {"pending": pool.pending, "left": [group.index for group in pool.groups]}
        facts = run_facts(runtime)
    return {
        **facts,
        "config": config,
        "rollouts": rollouts,
        "weights": weights,
        "stopped": stopped,
        "after": after,
        "log": read_jsonl(root / "run" / "metrics.jsonl"),
    }


def test_token_versions_follow_the_schedule_and_the_bound_is_reached(run):
    older = 0
    for step, rollouts in enumerate(run["rollouts"], start=1):
        mask = rollouts["response_mask"]
        assert torch.equal(rollouts["token_versions"], expected_versions(step, mask)), step
        if step in OLDER:
            version, tokens = OLDER[step]
            own = mask.bool() & (rollouts["token_versions"] == version)
            older += int(own.sum())
            assert int(own.sum()) == int(mask[:, :tokens].sum())
    # The pool generated during the updates: tokens of the rounds left running are trained.
    assert older > 0
    log = run["log"]
    assert [record["step"] for record in log] == list(range(1, STEPS + 1))
    assert [record["async/staleness_max"] for record in log] == [0.0, 1.0, 1.0, 1.0]
    for step, (record, rollouts) in enumerate(zip(log, run["rollouts"], strict=True), start=1):
        mask = rollouts["response_mask"]
        stale = float(mask[:, : OLDER[step][1]].sum()) if step in OLDER else 0.0
        assert record["async/tokens_staleness_1"] == stale
        assert record["async/tokens_staleness_0"] == float(mask.sum()) - stale
        if step in COLLECTED:
            # Collected from the pool (the wait may be 0), the pool's seconds for the round recorded.
            assert record["async/trainer_wait_s"] >= 0 and record["async/pool_generate_s"] > 0
        else:
            assert "async/trainer_wait_s" not in record
        if step > 1:
            # Every later step runs the batch started a version before to the end, continuing its samples.
            assert record["partial/due_samples"] > 0
            assert record["partial/resumed_samples"] >= record["partial/due_samples"]
    assert [record["partial/pending_prompts"] for record in log] == PENDING_AFTER


def test_every_prompt_trains_once_and_the_checkpoint_keeps_the_round_in_flight(run):
    order = _data_order(run, (STEPS + 1) * BATCH)
    batches = [order[i * BATCH : (i + 1) * BATCH] for i in range(STEPS + 1)]
    assert [_trained(r) for r in run["rollouts"]] == batches[:STEPS]
    stopped = run["stopped"]
    # In flight at the stop: step 3's batch B3, on version 1, the pool's only prompts. The checkpoint
    # counts B3 as handed out (position after it) and held, and keeps its samples with the round's tokens.
    assert stopped["admitted"] == batches[2] and stopped["groups"] == batches[2]
    assert stopped["version"] == 1
    assert stopped["saved"]["owed_indices"] == batches[2]
    kept = stopped["kept"]["groups"]
    assert [group["index"] for group in kept] == batches[2] and {group["version"] for group in kept} == {1}
    place = {id(sample): (g, k) for g, samples in enumerate(stopped["live"]) for k, sample in enumerate(samples)}
    rows = 0
    for samples, out in stopped["round"]:
        lengths = out["response_lengths"].tolist()
        for row, sample in enumerate(samples):
            # Each sample is saved with the round's tokens, its only ones (B3's first round).
            g, k = place[id(sample)]
            mine = kept[g]["samples"][k]
            assert mine["token_ids"].tolist() == out["responses"][row, : lengths[row]].tolist()
            assert torch.equal(mine["log_probs"], out["rollout_log_probs"][row, : lengths[row]].double())
            assert mine["versions"].tolist() == [1] * lengths[row] and mine["rounds"] == 1
            rows += 1
    assert rows == BATCH * N
    # The resumed pool is the saved one, sample by sample.
    assert [(index, version) for index, version, _ in stopped["resumed"]] == [(g["index"], 1) for g in kept]
    for (_, _, samples), group in zip(stopped["resumed"], kept, strict=True):
        assert [s.token_ids for s in samples] == [s["token_ids"].tolist() for s in group["samples"]]
        assert [s.finish_reason for s in samples] == [s["finish_reason"] for s in group["samples"]]
    # Step 3 trains B3 with the settled tokens as each row's prefix, then B4 and B5 start once each.
    step3 = run["rollouts"][2]
    for index, _, samples in stopped["resumed"]:
        rows_of = [r for r in range(len(step3)) if int(step3["index"][r]) == index]
        for r, sample in zip(rows_of, samples, strict=True):
            prefix = len(sample.token_ids)
            assert step3["responses"][r, :prefix].tolist() == sample.token_ids
    assert run["after"] == {"pending": None, "left": batches[4]}
def test_each_token_was_sampled_by_the_weights_of_its_version(run):
    # Rows of steps 2-4 continue on version step - 1 what a round sampled on step - 2.
    assert sampled_by_their_versions(run) > 0
    # The weights do tell the versions apart: the newest weights miss the overlapped round's tokens.
    model = load_causal_lm(run["model_dir"])
    last = run["rollouts"][-1]
    model.load_state_dict(run["weights"][STEPS - 1])
    with torch.no_grad():
        newest = response_log_probs(model, last, run["sampling"])
    first = last["response_mask"].bool() & (last["token_versions"] == OLDER[STEPS][0])
    assert float((newest - last["rollout_log_probs"]).abs()[first].max()) > 1e-3


def test_the_split_pool_takes_partial_rollouts_and_staleness_0_is_still_refused(tmp_path):
    root = write_task(tmp_path)
    stream = ["async_rollout.partial_round_tokens=3", "async_rollout.max_staleness=1", *SPLIT]
    config = run_config(root, "hf", 1, stream)
    assert config.resource.splits_rollout and config.async_rollout.partial_round_tokens == 3
    with pytest.raises(ConfigError) as refused:
        run_config(root, "hf", 1, [*stream, "async_rollout.max_staleness=0"])
    assert any(
        "async_rollout.partial_round_tokens: 3 pauses samples" in problem and "async_rollout.max_staleness" in problem
        for problem in refused.value.problems
    ), refused.value.problems


WIDER = 2
"""``max_staleness`` of the second run: the first step starts two batches, prompts left over go on."""


@pytest.fixture(scope="module")
def wider(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("partial_pool_wider"))
    overrides = [*PARTIAL, *SPLIT, f"async_rollout.max_staleness={WIDER}", "trainer.save_every=0"]
    config = run_config(root, "hf", STEPS, [*overrides, f"trainer.output_dir={root / 'run'}"])
    rollouts: list[Batch] = []
    submitted: list[int] = []

    def step(runtime: Runtime, batch: Batch) -> Batch:
        rollouts.append(rl_step(runtime, batch))
        # The samples of the round the step left running on the pool during its update.
        pending = runtime.rollouts_ahead.partial.pending
        submitted.append(0 if pending is None else sum(len(call.samples) for call, _ in pending.calls))
        return rollouts[-1]

    with Runtime(config) as runtime:
        fit(runtime, step)
        pending = [group.index for group in runtime.rollouts_ahead.partial.groups]
        data, pad_id = runtime.train_data, runtime.tokenizer.pad_token_id
    return {
        "config": config,
        "data": data,
        "pad_id": pad_id,
        "rollouts": rollouts,
        "pending": pending,
        "submitted": submitted,
    }


def test_a_wider_bound_trains_every_prompt_started_once_within_it(wider):
    # Started: two batches in step 1, one by the round each of steps 1-3 left running (step 4 is the last).
    started = _data_order(wider, (STEPS + 1) * BATCH)
    trained = [i for rollouts in wider["rollouts"] for i in _trained(rollouts)]
    assert len(trained) == STEPS * BATCH and len(set(trained)) == len(trained)
    assert sorted(trained + wider["pending"]) == sorted(started)
    # Each step but the last left a round running on the pool: at least the next batch's N x BATCH samples.
    assert all(count >= BATCH * N for count in wider["submitted"][:-1]) and wider["submitted"][-1] == 0
    stale = 0
    for step, rollouts in enumerate(wider["rollouts"], start=1):
        mask = rollouts["response_mask"].bool()
        versions = rollouts["token_versions"]
        assert int(versions[mask].max()) <= step - 1 and int(versions[mask].min()) >= step - 1 - WIDER
        for row in range(len(rollouts)):
            row_versions = versions[row][mask[row]].tolist()
            assert row_versions == sorted(row_versions)
        stale += int((mask & (versions < step - 1)).sum())
    assert stale > 0
