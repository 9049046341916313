"""Generation ahead of the trainer does not bias training toward short samples.

One run: GRPO on the tiny target-character task, the HF engine on a rollout pool of its own (1 slot,
the actor on another), ``async_rollout.max_staleness: 2``, 3 steps of 32 prompts x 8 samples (768
rows), responses up to 64 tokens, ``trainer.rollout_dump`` on. The policy is the tiny model with its
EOS row of the output layer replaced by a random vector 15x the other rows' norm: the chance to stop
then depends on the context, so some samples stop after a token or two and others run for tens of
tokens (a heavy tail: the run's 768 rows had median 11 tokens, 90th percentile 40, 3.8% at the
64-token limit; the test asserts the 90th percentile is at least 3x the median).

Two records of the same samples, made in different places:
- generated: the rollout workers keep every row their engine samples (prompt index, response length,
  the policy version it served), a subclass of the shipped worker through ``worker_classes``;
- trained: the rows each step handed to the update, as the run's rollout dump records them.

With ``k = 2`` the pool takes steps 2 and 3 together after step 1, both on version 0: step 1 trains
at staleness 0, step 2 at 1, step 3 at 2, the bound. A design that dropped samples that went stale,
or trained the ones that came back first, would train a shorter selection. Here every generated row
is trained exactly once, in order, so the two length distributions agree: the two-sample KS statistic
is below its critical value at the 5% level. The same check rejects a selection that leaves out the
longest 10% of the generated rows, so it can fail.

A second run, partial rollouts (``async_rollout.partial_round_tokens``): the same model on the colocated
HF engine (1 slot), 3 steps of 16 prompts x 8 samples, rounds of 4 tokens, ``max_staleness: 1``,
``actor.lr=1e-4`` (the lengths stay heavy-tailed over the run: trained median 11, 90th percentile 45,
5% at the cap). With the bound at 1 it is reached in every step after the first: a prompt the step
before started is due and runs to the end, so step 1 trains the 16 of its 32 prompts that finish first,
step 2 the other 16, step t >= 3 the batch of step t - 1, and the batch the last step started stays
pending, one round in. The records:
- the engine's: an actor worker subclass keeps every row its engine generates (the prompt it was fed,
  which for a continued sample is prompt + response so far, the new tokens, the finish reason), from
  which the test rebuilds the lengths of the samples the engine finished, by prompt;
- the trainer's: the rows each step returned, with their ``token_versions``.
The test checks that every prompt started is trained once or is among the 16 pending; that the trained
lengths are, per prompt, the finished lengths; that the KS statistic of the trained lengths against every
finished sample's passes at 5%; that the pending prompts' finished samples are all short (at most one
round) and the long ones are paused, so the finished-but-untrained samples of a stopped run fail the
KS check against the trained ones (where partial rollouts' end-of-run bias sits); and that no token
trains more than 1 version stale while many rows mix two versions.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow.controller import register
from hybridflow.data import PromptLoader
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.metrics import ks_statistic, read_jsonl
from hybridflow.metrics.rollout_dump import read_rollout_dump
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.sampling import SamplingParams
from tests.trainer._runs import run_config, write_task
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.runtime import Runtime
from workers.actor import ActorRolloutRefWorker
from workers.rollout import RolloutWorker

STEPS = 3
PROMPTS = 32
SAMPLES = 8
MAX_RESPONSE = 64
MAX_STALENESS = 2
LEVEL = 0.05
# Two-sample KS critical value at LEVEL: c(a) * sqrt((n + m) / (n m)), c(a) = sqrt(-ln(a / 2) / 2).
C_LEVEL = math.sqrt(-math.log(LEVEL / 2) / 2)
SETTINGS = [
    "actor.param_dtype=float32",
    "resource.slots_per_node=1",
    f"data.train_batch_size={PROMPTS}",
    f"rollout.n={SAMPLES}",
    f"data.max_response_length={MAX_RESPONSE}",
    "actor.ppo_mini_batch_size=256",
    "actor.ppo_micro_batch_size=64",
    "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
    "resource.placement={rollout: rollout_pool}",
    f"async_rollout.max_staleness={MAX_STALENESS}",
    "actor.rollout_correction=token",
    "trainer.rollout_dump=true",
]


class RecordingRolloutWorker(RolloutWorker):
    """The shipped rollout worker, keeping ``(prompt index, response length, policy version)`` of every
    row its engine samples, in the order sampled."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.sampled: list[tuple[int, int, int]] = []

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        rollouts = super()._sample(engine, prompts, sampling)
        lengths = rollouts["response_mask"].sum(-1).tolist()
        self.sampled += [(int(i), int(n), self.policy_version) for i, n in zip(rollouts["index"], lengths, strict=True)]
        return rollouts

    @register(dispatch="one_to_all")
    def sampled_rows(self) -> list[tuple[int, int, int]]:
        """Every row sampled so far."""
        return self.sampled


def write_long_tail_model(folder: Path) -> None:
    """The tiny model of the trainer tests whose EOS logit swings with the context (module docstring)."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(  # the builder's defaults are the trainer tests' tiny shape
        len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.no_grad():
        head = model.lm_head.weight
        eos = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(1))
        head[tokenizer.eos_token_id] = eos * (15 * float(head.norm(dim=1).mean()) / float(eos.norm()))
    save_model_dir(model, tokenizer, folder)


def ks_critical(n: int, m: int) -> float:
    """The two-sample KS statistic's critical value at `LEVEL` for samples of ``n`` and ``m``."""
    return C_LEVEL * math.sqrt((n + m) / (n * m))


@pytest.fixture(scope="module")
def long_tail_model(tmp_path_factory) -> Path:
    """The folder of the long-tail model, which both runs start from."""
    folder = tmp_path_factory.mktemp("long_tail_model")
    write_long_tail_model(folder)
    return folder


@pytest.fixture(scope="module")
def run(ray_cluster, tmp_path_factory, long_tail_model):
    root = write_task(tmp_path_factory.mktemp("length_bias"), prompts=2 * PROMPTS)
    config = run_config(
        root, "hf", STEPS, [*SETTINGS, f"model.path={long_tail_model}", f"trainer.output_dir={root / 'run'}"]
    )
    with Runtime(config, worker_classes={"rollout": RecordingRolloutWorker}) as runtime:
        fit(runtime, rl_step)
        generated = runtime.rollout.sampled_rows()[0]
    dump = read_rollout_dump(root / "run" / "rollouts")
    return {
        "generated": generated,
        "trained": [(row["index"], row["response_length"], row["policy_version"]) for s in dump for row in dump[s]],
        "trained_by_step": dump,
        "log": read_jsonl(root / "run" / "metrics.jsonl"),
    }


def test_the_lengths_are_heavy_tailed(run):
    lengths = np.array([length for _, length, _ in run["generated"]])
    assert len(lengths) == STEPS * PROMPTS * SAMPLES
    median, tenth = np.quantile(lengths, [0.5, 0.9])
    assert tenth >= 3 * median, (median, tenth)
    assert lengths.min() <= 2 and lengths.max() >= 5 * median, (lengths.min(), median, lengths.max())


def test_the_bound_is_active_and_holds(run):
    # Trainer version at step s: s - 1 updates; every row of steps 1-3 was sampled on version 0.
    for step, rows in run["trained_by_step"].items():
        assert {row["policy_version"] for row in rows} == {0}, step
    assert [record["async/staleness_max"] for record in run["log"]] == [0, 1, MAX_STALENESS]


def test_every_generated_sample_is_trained_exactly_once(run):
    # The same rows in the same order: none dropped, none repeated, none trained that was not sampled.
    assert run["trained"] == run["generated"]


def test_trained_lengths_have_the_generated_distribution(run):
    generated = [length for _, length, _ in run["generated"]]
    trained = [length for _, length, _ in run["trained"]]
    statistic = ks_statistic(generated, trained)
    assert statistic <= ks_critical(len(generated), len(trained)), statistic


def test_the_ks_check_rejects_a_selection_without_the_longest_tenth(run):
    generated = sorted(length for _, length, _ in run["generated"])
    kept = generated[: len(generated) - len(generated) // 10]
    statistic = ks_statistic(generated, kept)
    assert statistic > ks_critical(len(generated), len(kept)), statistic



# ------------------------------------------------------------------------------------ partial rollouts

PARTIAL_PROMPTS = 16
PARTIAL_STEPS = 3
ROUND_TOKENS = 4
PARTIAL_STALENESS = 1
PARTIAL_SETTINGS = [
    "actor.param_dtype=float32",
    "resource.slots_per_node=1",
    f"data.train_batch_size={PARTIAL_PROMPTS}",
    f"rollout.n={SAMPLES}",
    f"data.max_response_length={MAX_RESPONSE}",
    "actor.lr=1e-4",
    f"actor.ppo_mini_batch_size={PARTIAL_PROMPTS * SAMPLES}",
    "actor.ppo_micro_batch_size=64",
    f"async_rollout.partial_round_tokens={ROUND_TOKENS}",
    f"async_rollout.max_staleness={PARTIAL_STALENESS}",
    "actor.rollout_correction=token",
]

EngineRow = tuple[tuple[int, ...], int, str]
"""One row an engine generated: its prompt's ids (a partial round's prompt is the sample's prompt and
its response so far), the new tokens, the finish reason."""


class RecordingActorWorker(ActorRolloutRefWorker):
    """The shipped actor worker with its colocated engine, keeping every row the engine generates
    (`EngineRow`), in the order generated: a record of what was sampled made without the trainer's
    bookkeeping of which sample a row continues."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.generated: list[EngineRow] = []

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        rollouts = super()._sample(engine, prompts, sampling)
        prefixes = [
            tuple(ids[mask.bool()].tolist())
            for ids, mask in zip(prompts["input_ids"], prompts["attention_mask"], strict=True)
        ]
        n = len(rollouts) // len(prompts)
        rows = zip(rollouts["response_lengths"].tolist(), rollouts["finish_reason"], strict=True)
        self.generated += [(prefixes[row // n], int(new), reason) for row, (new, reason) in enumerate(rows)]
        return rollouts

    @register(dispatch="one_to_all")
    def generated_rows(self) -> list[EngineRow]:
        """Every row generated so far."""
        return self.generated


def finished_lengths(rows: list[EngineRow], prompt_index: dict[tuple[int, ...], int]) -> dict[int, list[int]]:
    """The response lengths of the samples the engine finished, by prompt index: a row whose call stopped
    (``"stop"``) or brought its response to the cap finishes a sample of (prefix - prompt) + new tokens.
    Every prompt the engine was given is a key (its list possibly empty)."""
    (width,) = {len(ids) for ids in prompt_index}  # the task's prompts all have one length
    finished: dict[int, list[int]] = {}
    for prefix, new, reason in rows:
        lengths = finished.setdefault(prompt_index[prefix[:width]], [])
        total = len(prefix) - width + new
        if reason == "stop" or total == MAX_RESPONSE:
            lengths.append(total)
    return finished


@pytest.fixture(scope="module")
def partial_run(ray_cluster, tmp_path_factory, long_tail_model):
    started = (PARTIAL_STEPS + 1) * PARTIAL_PROMPTS  # the first step starts 2 batches, the others 1 each
    root = write_task(tmp_path_factory.mktemp("length_bias_partial"), prompts=started)
    config = run_config(
        root,
        "hf",
        PARTIAL_STEPS,
        [*PARTIAL_SETTINGS, f"model.path={long_tail_model}", f"trainer.output_dir={root / 'run'}"],
    )
    trained: list[dict] = []

    def step(runtime: Runtime, prompts: Batch) -> Batch:
        version = runtime.actor.policy_version()[0]
        rollouts = rl_step(runtime, prompts)
        mask = rollouts["response_mask"].bool()
        versions = [row[keep].tolist() for row, keep in zip(rollouts["token_versions"], mask, strict=True)]
        lengths = mask.sum(-1).tolist()
        trained.append({"version": version, "index": rollouts["index"].tolist(), "length": lengths, "tokens": versions})
        return rollouts

    with Runtime(config, worker_classes={"actor_rollout": RecordingActorWorker}) as runtime:
        fit(runtime, step)
        rows = runtime.actor.generated_rows()[0]
        pending = {
            group.index: (group.version, [(len(s.token_ids), s.finished) for s in group.samples])
            for group in runtime.rollouts_ahead.partial.groups
        }
        prompt_index = {tuple(item["input_ids"].tolist()): item["index"] for item in runtime.train_data}
        pad_id, data = runtime.tokenizer.pad_token_id, config.data
        loader = PromptLoader(runtime.train_data, PARTIAL_PROMPTS, pad_id, seed=data.seed, shuffle=data.shuffle)
    assert len(prompt_index) == started  # no two prompts share their ids
    return {
        "trained": trained,
        "pending": pending,
        "finished": finished_lengths(rows, prompt_index),
        "batches": [[int(i) for i in batch["index"]] for batch in loader],
    }


def _prompts(rows: list[int]) -> list[int]:
    """The prompts of a step's rows, which come ``SAMPLES`` consecutive per prompt."""
    assert all(rows[i] == rows[i - i % SAMPLES] for i in range(len(rows)))
    return rows[::SAMPLES]


def test_partial_every_prompt_started_is_trained_once_or_pending(partial_run):
    batches, trained = partial_run["batches"], partial_run["trained"]
    by_step = [_prompts(step["index"]) for step in trained]
    assert [len(prompts) for prompts in by_step] == [PARTIAL_PROMPTS] * PARTIAL_STEPS
    every = [i for prompts in by_step for i in prompts]
    assert len(every) == len(set(every))  # none trained twice
    # Started: the engine was given exactly the first PARTIAL_STEPS + 1 batches of the data order.
    started = {i for batch in batches[: PARTIAL_STEPS + 1] for i in batch}
    assert set(partial_run["finished"]) == started
    # With max_staleness 1 a prompt trains in the step that starts it or the next (it is due then): steps
    # 1-2 train the first two batches, step t >= 3 batch t, and the batch started by the last step is
    # left pending, one batch's worth, having had one round.
    assert sorted(by_step[0] + by_step[1]) == sorted(batches[0] + batches[1])
    for step in range(3, PARTIAL_STEPS + 1):
        assert sorted(by_step[step - 1]) == sorted(batches[step - 1])
    pending = partial_run["pending"]
    assert set(pending) == started - set(every) == set(batches[PARTIAL_STEPS])
    assert {version for version, _ in pending.values()} == {PARTIAL_STEPS - 1}


def test_partial_trained_lengths_are_the_lengths_the_engine_finished(partial_run):
    finished = partial_run["finished"]
    trained: dict[int, list[int]] = {}
    for step in partial_run["trained"]:
        for index, length in zip(step["index"], step["length"], strict=True):
            trained.setdefault(index, []).append(length)
    for index, lengths in trained.items():
        # All SAMPLES of it, with the lengths at which the engine ended them.
        assert sorted(lengths) == sorted(finished[index]), index
    lengths = [n for ls in trained.values() for n in ls]
    every_finished = [n for ls in finished.values() for n in ls]
    statistic = ks_statistic(lengths, every_finished)
    assert statistic <= ks_critical(len(lengths), len(every_finished)), statistic


def test_partial_long_samples_are_the_ones_left_paused(partial_run):
    """At the end the pending prompts (the last step's batch, one round of ROUND_TOKENS each) hold
    their short samples finished and every longer one paused: the finished samples a stopped run leaves
    untrained are all short, so a design that trained finished samples without their group would be
    biased short there."""
    finished, pending = partial_run["finished"], partial_run["pending"]
    left_finished = [n for index in pending for n in finished[index]]
    assert left_finished and max(left_finished) <= ROUND_TOKENS
    paused = [n for _, samples in pending.values() for n, done in samples if not done]
    assert paused == [ROUND_TOKENS] * len(paused)
    assert len(left_finished) + len(paused) == SAMPLES * PARTIAL_PROMPTS
    assert len(paused) >= SAMPLES * PARTIAL_PROMPTS / 2  # most of them (measured: 114 of 128)
    trained = [n for step in partial_run["trained"] for n in step["length"]]
    statistic = ks_statistic(trained, left_finished)
    assert statistic > ks_critical(len(trained), len(left_finished)), statistic


def test_partial_token_versions_stay_within_the_bound_and_mix(partial_run):
    mixed = 0
    for step, record in enumerate(partial_run["trained"], start=1):
        assert record["version"] == step - 1
        staleness = [record["version"] - v for row in record["tokens"] for v in row]
        assert min(staleness) >= 0 and max(staleness) <= PARTIAL_STALENESS
        if step > 1:
            assert max(staleness) == PARTIAL_STALENESS  # the bound is reached: due prompts ran to the end
        for row in record["tokens"]:
            assert row == sorted(row)  # a sample only goes on to newer weights
            mixed += len(set(row)) > 1
            if step > 2:
                # Started by the step before, which gave it one round, then run to the end on this step's weights.
                first = min(len(row), ROUND_TOKENS)
                assert row == [step - 2] * first + [step - 1] * (len(row) - first)
    assert mixed > 0  # paused in one step, continued in the next (measured: 143 of 384 rows)
