"""A run with an ``agent`` section trains on episodes: `rl_step` runs `agent_generate` and the usual update.

Real Ray, gloo, FSDP2 and the HF engine on 2 ranks. The policy is a tiny character model built and
trained here (a few hundred optimizer steps on one sequence) to answer ``7*6=`` with a calculator call,
then, after the tool's result, with the number: so the episodes really call the tool and the ledgers
hold inserted ids. The environment is ``tool_calls`` with the calculator, subclassed only to write down
what each episode saw (the prompt's ids, each turn's sampled ids, each observation) in files the test
reads back. Two GRPO steps run; the test then checks, position by position, that the rows the step
trained on are the engine's ids plus the inserted ones, that the actor update received ``loss_mask``
equal to the episodes' policy mask, and that the agent metrics were logged with the counts of the
records.
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.agents import ModelTurn, Observation, StepResult, ToolCallEnvironment, register_environment
from hybridflow.controller import register
from hybridflow.data import write_rows
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.metrics import read_jsonl
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.rewards.rule_based import exact_match_reward
from trainer.algorithms import rl_step
from trainer.config import ConfigError, load_config
from trainer.fit import fit
from trainer.runtime import Runtime
from workers.actor import ActorRolloutRefWorker

PROMPT = "7*6="
CALL = "<calculator>7*6</calculator>"
OBSERVATION = "<result>42</result>"
ANSWER = "42"
STEPS = 2
TOKENIZER = build_char_tokenizer()
_ROW_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask")


@register_environment("recorded_tool_calls")
class RecordedToolCalls(ToolCallEnvironment):
    """``tool_calls`` that writes what its episode saw to ``record_dir/<id>.json`` after every step."""

    def __init__(self, tools: Sequence[str], reward: str, record_dir: str) -> None:
        super().__init__(tools, reward)
        self.path = Path(record_dir) / f"{uuid.uuid4().hex}.json"
        self.record: dict[str, list] = {"prompt": [], "turns": [], "observations": []}

    def start(self, row: Mapping[str, Any]) -> Observation:
        self.record["prompt"] = list(row["prompt"].ids)
        return super().start(row)

    def step(self, turn: ModelTurn) -> StepResult:
        result = super().step(turn)
        self.record["turns"].append(list(turn.token_ids))
        if not result.done:
            self.record["observations"].append(result.observation)
        self.path.write_text(json.dumps(self.record))
        return result


class UpdateRecordingActor(ActorRolloutRefWorker):
    """Records the columns, prompt ids, responses and ``loss_mask`` each actor update received."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.updates: list[dict[str, Any]] = []

    def update_actor(self, batch: Batch, **kwargs) -> dict[str, float]:
        self.updates.append(
            {
                "columns": sorted(batch.keys()),
                **{key: batch[key].clone() for key in _ROW_COLUMNS},
                "loss_mask": batch["loss_mask"].clone() if "loss_mask" in batch else None,
            }
        )
        return super().update_actor(batch, **kwargs)

    @register(dispatch="rank_zero")
    def recorded_updates(self) -> list[dict[str, Any]]:
        return self.updates


def _encode(text: str) -> list[int]:
    return TOKENIZER(text, add_special_tokens=False)["input_ids"]


def _trained_model_dir(root: Path) -> Path:
    """A tiny character model that writes ``CALL`` after ``PROMPT`` and ``ANSWER`` after the result (each
    ended by the end-of-sequence id)."""
    eos = TOKENIZER.eos_token_id
    head = _encode(PROMPT) + _encode(CALL) + [eos]
    ids = torch.tensor([head + _encode(OBSERVATION) + _encode(ANSWER) + [eos]])
    # No loss on the observation: its ids stay unlikely under the policy, so a sync check that compared
    # them with the engine's (absent) log-probs would fail.
    labels = ids.clone()
    labels[0, len(head) : len(head) + len(OBSERVATION)] = -100
    model = build_tiny_causal_lm(len(TOKENIZER), max_position_embeddings=256, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.01, f"the tiny model did not learn its script (loss {loss.item():.3f})"
    return save_model_dir(model, TOKENIZER, root / "model")


def _overrides(root: Path, model_dir: Path, record_dir: Path) -> list[str]:
    return [
        f"data.train_files=[{root / 'train.parquet'}]",
        "data.max_prompt_length=8",
        "data.max_response_length=88",
        "data.train_batch_size=4",
        "data.seed=0",
        f"model.path={model_dir}",
        "rollout.engine=hf",
        "rollout.n=4",
        "rollout.temperature=1.0",
        "rollout.kv_cache_bytes=33554432",
        "actor.lr=0.001",
        "actor.ppo_mini_batch_size=16",
        "actor.ppo_micro_batch_size=8",
        "actor.forward_micro_batch_size=8",
        "actor.param_dtype=float32",
        "actor.skip_zero_advantage_rows=false",
        "agent.environment=recorded_tool_calls",
        f"agent.environment_kwargs={{tools: [calculator], reward: exact_match, record_dir: '{record_dir}'}}",
        "agent.max_turns=3",
        "agent.max_total_tokens=96",
        "agent.tool_workers=2",
        f"trainer.total_steps={STEPS}",
        "trainer.val_before_train=false",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={root / 'run'}",
        "resource.cpus_per_slot=0.5",
    ]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("agent_episodes")
    rows = [
        {
            "data_source": "toy/multiply",
            "prompt": [{"role": "user", "content": PROMPT}],
            "reward_model": {"ground_truth": ANSWER},
            "extra_info": {"index": i},
        }
        for i in range(8)
    ]
    write_rows(rows, root / "train.parquet")
    record_dir = root / "records"
    record_dir.mkdir()
    return root, _trained_model_dir(root), record_dir


@pytest.fixture(scope="module")
def trained(ray_cluster, task):
    root, model_dir, record_dir = task
    config = load_config(None, _overrides(root, model_dir, record_dir))
    steps: list[Batch] = []

    def recorded_step(runtime: Runtime, prompts: Batch) -> Batch:
        rollouts = rl_step(runtime, prompts)
        steps.append(rollouts)
        return rollouts

    with Runtime(config, worker_classes={"actor_rollout": UpdateRecordingActor}) as runtime:
        fit(runtime, recorded_step)
        updates = runtime.actor.recorded_updates()
    records = [json.loads(path.read_text()) for path in sorted(record_dir.glob("*.json"))]
    return steps, updates, records, read_jsonl(root / "run" / "metrics.jsonl")


def _ledger(record: dict[str, list]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """(prompt ids, response ids, policy mask) of a recorded episode: each turn's sampled ids, then the
    ids of the observation that followed it (none after the last turn)."""
    ids: list[int] = []
    mask: list[float] = []
    turns = record["turns"]
    for index, turn in enumerate(turns):
        ids += turn
        mask += [1.0] * len(turn)
        if index < len(turns) - 1:
            inserted = _encode(record["observations"][index])
            ids += inserted
            mask += [0.0] * len(inserted)
    return tuple(record["prompt"]), tuple(ids), tuple(mask)


def _rows(batch: Batch) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]]:
    """(prompt ids, response ids, loss mask over them) of each row of ``batch``."""
    out = []
    for row in range(len(batch)):
        prompt = batch["input_ids"][row][batch["attention_mask"][row].bool()]
        valid = batch["response_mask"][row].bool()
        response, loss_mask = batch["responses"][row][valid], batch["loss_mask"][row][valid]
        out.append((tuple(prompt.tolist()), tuple(response.tolist()), tuple(loss_mask.tolist())))
    return out


def test_the_rows_trained_on_are_the_engine_ids_plus_the_inserted_ones(trained):
    steps, _, records, _ = trained
    finishes = [finish for batch in steps for finish in batch["episode_finish"]]
    cut = finishes.count("max_tokens")
    assert cut <= 4, f"{cut} episodes ran out of tokens; the trained script is too weak"
    # An episode cut by a turn that filled its room never reached a step, so it may have no record.
    assert STEPS * 16 - cut <= len(records) <= STEPS * 16
    rows = [row for batch in steps for row in _rows(batch)]
    uncut = Counter(row for row, finish in zip(rows, finishes, strict=True) if finish != "max_tokens")
    ledgers = Counter(_ledger(record) for record in records)
    # Every episode the token limit did not cut is its record, id by id and mask bit by mask bit.
    assert not uncut - ledgers, f"rows no episode recorded: {list(uncut - ledgers)[:2]}"
    called = [ledger for ledger in uncut.elements() if 0.0 in ledger[2]]
    assert len(called) >= 8, f"the tool was called in {len(called)} episodes"
    for _, ids, mask in called:
        inserted = TOKENIZER.decode([token for token, bit in zip(ids, mask, strict=True) if bit == 0.0])
        assert re.fullmatch(r"(<result>[^<]*</result>)+", inserted), inserted


def test_the_episode_reward_is_the_step_score_at_the_last_response_id(trained):
    steps, _, _, _ = trained
    for batch in steps:
        lengths = batch["response_mask"].sum(dim=1)
        at_last = batch["token_level_scores"][torch.arange(len(batch)), lengths - 1]
        assert torch.equal(at_last, batch["scores"])
        assert torch.equal(batch["token_level_scores"].sum(dim=1), batch["scores"])
        for row in range(len(batch)):
            if batch["episode_finish"][row] != "done":
                continue
            # A done episode ended on its answer turn, which exact_match scored: the ids after the last
            # inserted one.
            length = int(lengths[row])
            inserted = (batch["loss_mask"][row][:length] == 0).nonzero().flatten().tolist()
            answer = batch["responses"][row][max([-1, *inserted]) + 1 : length].tolist()
            text = TOKENIZER.decode(answer, skip_special_tokens=True)
            assert batch["scores"][row].item() == exact_match_reward("toy/multiply", text, ANSWER)
    assert any(batch["scores"].sum() > 0 for batch in steps)


def test_the_actor_update_received_the_episodes_policy_mask(trained):
    steps, updates, _, _ = trained
    assert len(updates) == STEPS
    for batch, update in zip(steps, updates, strict=True):
        assert "loss_mask" in update["columns"]
        by_row = {row[:2]: row[2] for row in _rows(batch)}
        received = _rows(Batch({key: update[key] for key in (*_ROW_COLUMNS, "loss_mask")}))
        assert len(received) == len(batch) // 2  # rank 0's share
        for prompt, response, loss_mask in received:
            assert by_row[prompt, response] == loss_mask


def test_the_agent_metrics_are_logged_with_the_records_counts(trained):
    steps, _, records, metrics = trained
    assert [record["step"] for record in metrics] == list(range(1, STEPS + 1))
    calls = sum(len(record["observations"]) for record in records)
    assert sum(record["agent/tool_calls"] for record in metrics) == calls
    for record, batch in zip(metrics, steps, strict=True):
        assert record["agent/turns_mean"] == pytest.approx(batch["num_turns"].float().mean().item())
        assert record["agent/cut_max_tokens"] == sum(finish == "max_tokens" for finish in batch["episode_finish"])
        assert 0 < record["agent/masked_token_share"] < 1
        assert record["response/generated_tokens"] == batch["loss_mask"].sum().item()
        # The trainer's log-probs of the policy's ids equal the engine's (inserted ids are not compared).
        assert record["sync/log_prob_abs_diff_max"] < 1e-3


def test_an_unknown_environment_is_refused_before_ray_with_the_key_named(task):
    root, model_dir, record_dir = task
    overrides = [*_overrides(root, model_dir, record_dir), "agent.environment=recorded_tool_call"]
    with pytest.raises(ConfigError, match=r"agent\.environment: .*did you mean 'recorded_tool_calls'"):
        load_config(None, overrides)
    overrides = [*_overrides(root, model_dir, record_dir)]
    overrides[overrides.index("agent.max_total_tokens=96")] = "agent.max_total_tokens=200"
    with pytest.raises(ConfigError, match=r"agent\.max_total_tokens: 200 exceeds the engine's max_model_len"):
        load_config(None, overrides)
