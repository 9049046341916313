"""Partial rollouts in the trainer (``async_rollout.partial_round_tokens``), colocated, stopped and resumed
while prompts still have paused samples.

One run: the target-character task of the trainer tests, the HF engine on 1 slot, fp32, 8 prompts a step,
4 samples each, responses of at most 8 tokens generated in rounds of 3, ``max_staleness`` 1, 5 steps, a
checkpoint every 2 steps. It stops after step 2, when prompts started in steps 1-2 still run; a new
runtime resumes from that checkpoint for steps 3 to 5. The step function keeps each step's rollouts and
the actor's weights before its update (those of version ``step - 1``).

By hand: the first step of a run starts two batches (16 prompts), every later step one, and every step
trains 8; so 16 + 8 = 24 prompts are started before the stop, 8 of them left untrained with their samples
paused. The checkpoint keeps those samples: the resumed runtime's pool holds the 8 again (started at
version 1, so due in step 3, which trains them, their kept tokens first), and from then on it starts one
batch a step as the uninterrupted run would: 3 * 8 = 24 prompts of the data order from where the
checkpoint left it. A second run of the same config without the stop trains the same rows, token for
token: the per-step sampling seeds make the resume exact.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from hybridflow.checkpoint import CheckpointStore
from hybridflow.data import PromptLoader
from hybridflow.metrics import read_jsonl
from hybridflow.models import load_causal_lm
from hybridflow.protocol import Batch
from hybridflow.rollout.logprobs import response_log_probs
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.config import ConfigError
from trainer.fit import StopAt, fit
from trainer.rollout_queue import PARTIAL_FILE, PartialPool
from trainer.runtime import Runtime
from trainer.steps import generate, sampling_params

STEPS = 5
BATCH = 8
N = 4
MAX_STALENESS = 1
PARTIAL = [
    "actor.param_dtype=float32",
    "resource.slots_per_node=1",
    f"data.train_batch_size={BATCH}",
    f"rollout.n={N}",
    "rollout.engine=hf",
    "actor.ppo_mini_batch_size=32",
    "actor.ppo_micro_batch_size=32",
    "async_rollout.partial_round_tokens=3",
    f"async_rollout.max_staleness={MAX_STALENESS}",
    "trainer.save_every=2",
]


@pytest.fixture(scope="module")
def run(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("partial"))
    config = run_config(root, "hf", STEPS, [*PARTIAL, f"trainer.output_dir={root / 'run'}"])
    rollouts: list[Batch] = []
    weights: list[dict[str, torch.Tensor]] = []
    held: list[list[int]] = []
    pools: list[list[tuple]] = []
    step = recording_step(rollouts, weights, pools)
    with Runtime(config) as runtime:
        fit(runtime, step, stop=StopAt(steps=2))
        held.append(sorted(g.index for g in runtime.rollouts_ahead.partial.groups))
        stopped = pool_contents(runtime.rollouts_ahead.partial)
        saved = runtime.prompts.state_dict()
    checkpoint = CheckpointStore(config.trainer.checkpoint_dir).path_of(2) / PARTIAL_FILE
    in_checkpoint = torch.load(checkpoint, weights_only=True)
    with Runtime(config) as runtime:
        fit(runtime, step)
        held.append(sorted(g.index for g in runtime.rollouts_ahead.partial.groups))
        facts = run_facts(runtime)
    # The same run without the stop, in a folder of its own.
    uninterrupted: list[Batch] = []
    again = run_config(root, "hf", STEPS, [*PARTIAL, "trainer.save_every=0", f"trainer.output_dir={root / 'again'}"])
    refused = []
    with Runtime(again) as runtime:
        fit(runtime, recording_step(uninterrupted, None))
        pool = runtime.rollouts_ahead.partial
        left = [pool_contents(pool)]
        # A second generate in the last step (dynamic sampling would), then a step given 3 prompts.
        for prompts in (runtime.next_prompts(), runtime.next_prompts()[:3]):
            with pytest.raises(ValueError) as error:
                generate(runtime, prompts)
            refused.append(str(error.value))
            runtime.begin_step()
        left.append(pool_contents(pool))
    return {
        "refused": refused,
        "left_after_refusals": left,
        **facts,
        "config": config,
        "rollouts": rollouts,
        "uninterrupted": uninterrupted,
        "weights": weights,
        "held": held,
        "pools": pools,
        "stopped": stopped,
        "in_checkpoint": in_checkpoint,
        "saved": saved,
        "log": read_jsonl(root / "run" / "metrics.jsonl"),
    }


def pool_contents(pool: PartialPool) -> list[tuple]:
    """Every group of ``pool``, oldest first: its index, version, prompt ids (left-padded, as started)
    and its samples' token ids, log-probs, versions (copies: the samples go on), finish reason and rounds."""
    return [
        (
            group.index,
            group.version,
            group.prompt["input_ids"].tolist(),
            [
                (s.group, s.prompt_ids, [*s.token_ids], [*s.log_probs], [*s.versions], s.finish_reason, s.rounds)
                for s in group.samples
            ],
        )
        for group in pool.groups
    ]


def recording_step(
    rollouts: list[Batch], weights: list[dict[str, torch.Tensor]] | None, pools: list[list[tuple]] | None = None
) -> Callable[[Runtime, Batch], Batch]:
    """`rl_step`, keeping each step's rollouts, the actor's weights before its update (those of version
    ``runtime.step - 1``; not kept when ``weights`` is None) and, when ``pools`` is given, the partial
    pool's contents before the step generates (`pool_contents`)."""

    def step(runtime: Runtime, batch: Batch) -> Batch:
        if weights is not None:
            weights.append(runtime.actor.gather_full_state()[0])
        if pools is not None:
            pools.append(pool_contents(runtime.rollouts_ahead.partial))
        rollouts.append(rl_step(runtime, batch))
        return rollouts[-1]

    return step


def run_facts(runtime: Runtime) -> dict[str, object]:
    """What the checks need of a finished run: its model folder, training data, pad id and sampling."""
    return {
        "model_dir": runtime.model_dir,
        "data": runtime.train_data,
        "pad_id": runtime.tokenizer.pad_token_id,
        "sampling": sampling_params(runtime),
    }


def _data_order(run, count: int) -> list[int]:
    config = run["config"].data
    loader = PromptLoader(
        run["data"], config.train_batch_size, run["pad_id"], seed=config.seed, shuffle=config.shuffle
    )
    order: list[int] = []
    while len(order) < count:
        order.extend(int(i) for batch in loader for i in batch["index"])
    return order[:count]


def _trained(rollouts: Batch) -> list[int]:
    """The prompts a step trained (one per group of ``N`` rows)."""
    return [int(i) for i in rollouts["index"][::N]]


def test_no_prompt_is_lost_or_trained_twice_across_the_resume(run):
    trained = [_trained(r) for r in run["rollouts"]]
    assert [len(t) for t in trained] == [BATCH] * STEPS
    before, after = trained[:2], trained[2:]
    started_before = _data_order(run, 24)
    # What the checkpoint of step 2 holds: the prompts started and not trained, which the stop left paused.
    assert sorted(run["saved"]["owed_indices"]) == run["held"][0]
    assert sorted(run["held"][0]) == sorted(set(started_before) - {i for t in before for i in t})
    assert len(run["held"][0]) == 24 - 2 * BATCH
    # After the resume: the held prompts go on (due at version 2, step 3 trains them all), and one batch a
    # step is started from the data order where the checkpoint left it.
    assert sorted(after[0]) == run["held"][0]
    started_after = _data_order(run, 24 + 24)[24:]
    every = [i for t in trained for i in t]
    assert len(every) == len(set(every))  # none trained twice
    assert sorted([i for t in after for i in t] + run["held"][1]) == sorted(run["held"][0] + started_after)
    # Prompts the resumed run started: those of the data order, never a held one again.
    assert sorted(g[0] for g in run["pools"][3]) == sorted(started_after[:BATCH])
    assert sorted(g[0] for g in run["pools"][4]) == sorted(started_after[BATCH : 2 * BATCH])


def test_the_checkpoint_keeps_the_paused_samples_and_the_resume_restores_them(run):
    stopped, restored = run["stopped"], run["pools"][2]  # the pool at the stop; before step 3 generates
    assert restored == stopped
    assert [g[0] for g in stopped] == [group["index"] for group in run["in_checkpoint"]["groups"]]
    samples = [sample for group in stopped for sample in group[3]]
    assert len(samples) == BATCH * N
    # Samples paused after their first round in step 2 (version 1), tokens kept.
    paused = [s for s in samples if s[2] and s[5] is None]
    assert paused and all(set(s[4]) == {1} and s[6] == 1 for s in paused)


def test_the_resumed_step_trains_the_kept_samples_as_prefixes(run):
    rollouts = run["rollouts"][2]  # step 3, the resumed runtime's first
    rows = {int(i): row for row, i in reversed(list(enumerate(rollouts["index"])))}  # each group's first row
    continued = 0
    for index, _, prompt, samples in run["stopped"]:
        first = rows[index]
        width = rollouts["input_ids"].shape[1]
        assert rollouts["input_ids"][first, width - len(prompt[0]) :].tolist() == prompt[0]
        for offset, (_, _, tokens, log_probs, versions, reason, _) in enumerate(samples):
            row, kept = first + offset, len(tokens)
            assert rollouts["responses"][row, :kept].tolist() == tokens
            assert rollouts["token_versions"][row, :kept].tolist() == versions
            expected = torch.tensor(log_probs, dtype=torch.float32)
            assert torch.equal(rollouts["rollout_log_probs"][row, :kept], expected)
            length = int(rollouts["response_lengths"][row])
            assert length == kept if reason is not None else length > kept
            continued += reason is None
    assert continued > 0


def test_the_resumed_run_trains_what_the_uninterrupted_run_trains(run):
    """The resume is exact: every step's rows, token for token, with their versions and log-probs."""
    assert len(run["uninterrupted"]) == STEPS
    for step, (resumed, whole) in enumerate(zip(run["rollouts"], run["uninterrupted"], strict=True), start=1):
        assert _trained(resumed) == _trained(whole), step
        for column in ("input_ids", "responses", "response_mask", "token_versions", "rollout_log_probs"):
            assert torch.equal(resumed[column], whole[column]), (step, column)


def test_rows_keep_the_versions_of_their_tokens(run):
    mixed = 0
    for step, rollouts in enumerate(run["rollouts"], start=1):
        mask = rollouts["response_mask"].bool()
        versions = rollouts["token_versions"]
        assert torch.equal(versions[~mask], torch.zeros_like(versions[~mask]))
        trainer_version = step - 1
        valid = versions[mask]
        assert int(valid.max()) <= trainer_version and int(valid.min()) >= trainer_version - MAX_STALENESS
        for row in range(len(rollouts)):
            row_versions = versions[row][mask[row]].tolist()
            assert row_versions == sorted(row_versions)  # a sample only goes on to newer weights
            mixed += len(set(row_versions)) > 1
    assert mixed > 0  # some samples were paused in one step and continued in a later one


def test_staleness_metrics_count_tokens_by_their_own_version(run):
    log = run["log"]
    assert [record["step"] for record in log] == list(range(1, STEPS + 1))
    resumed = 0.0
    for step, (record, rollouts) in enumerate(zip(log, run["rollouts"], strict=True), start=1):
        mask = rollouts["response_mask"].bool()
        staleness = (step - 1) - rollouts["token_versions"][mask]
        for s in range(MAX_STALENESS + 1):
            assert record[f"async/tokens_staleness_{s}"] == float((staleness == s).sum())
        assert record["async/staleness_max"] == float(staleness.max())
        assert record["partial/pending_prompts"] == BATCH  # 2 batches started by the first step, 1 trained
        resumed += record["partial/resumed_samples"]
        assert record["partial/rounds"] >= 1
    assert resumed > 0
    assert sum(record["async/tokens_staleness_1"] for record in log) > 0
    # A prompt started in the step before that has not finished runs to the end: the bound, exercised.
    assert sum(record["partial/due_samples"] for record in log) > 0


def test_each_token_was_sampled_by_the_weights_of_its_version(run):
    """The engine's log-prob of each token is that of the weights of the token's version, recomputed with
    the whole prefix as context (a prefix fed back continues the sample it paused)."""
    assert sampled_by_their_versions(run) > 0  # tokens sampled on newer weights than their row's first tokens


def sampled_by_their_versions(run) -> int:
    """Check that each trained token's engine log-prob is that of the weights of its version (``run``'s
    ``weights[v]``, recomputed with the whole prefix as context); returns how many tokens were sampled
    on newer weights than their row's first tokens."""
    model = load_causal_lm(run["model_dir"])
    continued = 0
    for rollouts in run["rollouts"]:
        versions = rollouts["token_versions"]
        mask = rollouts["response_mask"].bool()
        for version in sorted(set(versions[mask].tolist())):
            model.load_state_dict(run["weights"][version])
            with torch.no_grad():
                recomputed = response_log_probs(model, rollouts, run["sampling"])
            own = mask & (versions == version)
            gap = (recomputed - rollouts["rollout_log_probs"]).abs()[own]
            assert float(gap.max()) < 1e-4, (version, float(gap.max()))
            continued += int((own & (versions > versions[:, :1])).sum())
    return continued


def test_a_second_generate_in_a_step_and_a_batch_of_another_size_are_refused(run):
    second, smaller = run["refused"]
    assert second.startswith(f"async_rollout.partial_round_tokens=3: step {STEPS} called generate a second time")
    assert "dynamic sampling" in second
    assert smaller.startswith("async_rollout.partial_round_tokens=3: generate was given 3 prompts")
    assert f"data.train_batch_size={BATCH}" in smaller
    # Refused before anything started: the pool holds what the run left, unchanged.
    before, after = run["left_after_refusals"]
    assert before and after == before


def test_partial_rollouts_refuse_staleness_0(tmp_path):
    root = write_task(tmp_path)
    with pytest.raises(
        ConfigError, match=r"async_rollout\.partial_round_tokens: 3 pauses samples .*max_staleness >= 1"
    ):
        run_config(root, "hf", 1, ["async_rollout.partial_round_tokens=3"])


def test_samples_of_one_prompt_are_drawn_apart(run):
    """Every call of a step's rounds samples with its own seed: samples of one prompt continued in
    different calls, or started in one, do not repeat each other's draws."""
    for rollouts in run["rollouts"]:
        rows = [tuple(r[m.bool()].tolist()) for r, m in zip(rollouts["responses"], rollouts["response_mask"], strict=True)]
        groups = [rows[i : i + N] for i in range(0, len(rows), N)]
        assert sum(len(set(group)) == N for group in groups) >= len(groups) - 1, groups
