"""recipes/opd and the teacher role: the distillation advantage by hand, the teacher's log-probs against a
single-process forward of its own model, and two steps under `fit` on Ray with the teacher colocated with
the actor and on a pool of its own (one Ray start for the file: the session's `ray_cluster`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from hybridflow.algos import compute_advantage
from hybridflow.data import build_char_tokenizer
from hybridflow.metrics import read_jsonl
from hybridflow.models import build_tiny_causal_lm, load_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from recipes.opd import main as opd
from tests.trainer._runs import run_config, write_task
from trainer.config import ConfigError, load_config, recipe_settings
from trainer.fit import fit
from trainer.runtime import Runtime
from workers.teacher import check_same_vocabulary


def write_teacher(folder: Path, alphabet: str | None = None) -> Path:
    """A tiny causal LM unlike the test runs' student: 3 layers (the student has 2), its own seed and a
    wider weight init (0.05 against 0.02: more peaked next-token distributions), saved with the
    character tokenizer."""
    tokenizer = build_char_tokenizer() if alphabet is None else build_char_tokenizer(alphabet)
    model = build_tiny_causal_lm(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_layers=3,
        num_heads=2,
        num_kv_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        seed=11,
        initializer_range=0.05,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return save_model_dir(model, tokenizer, folder)


# ------------------------------------------------------------------------------ the advantage, by hand


def test_the_advantage_is_teacher_minus_student_log_prob_per_token():
    teacher = torch.tensor([[-0.5, -2.0, -1.0], [-3.0, -0.25, -9.0]])
    student = torch.tensor([[-1.5, -1.0, -4.0], [-1.0, -0.75, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    rollouts = Batch({"teacher_log_probs": teacher, "old_log_probs": student, "response_mask": mask})
    got = opd.distillation_advantages(rollouts)["advantages"]
    # -0.5 - (-1.5) = 1; -2 - (-1) = -1; padding 0 | -3 - (-1) = -2; -0.25 - (-0.75) = 0.5; -9 - (-2) = -7
    assert got.tolist() == [[1.0, -1.0, 0.0], [-2.0, 0.5, -7.0]]


def test_the_task_reward_advantage_is_added_with_its_weight():
    teacher = torch.tensor([[-0.5, -2.0, -1.0], [-3.0, -0.25, -9.0]])
    student = torch.tensor([[-1.5, -1.0, -4.0], [-1.0, -0.75, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    task = torch.tensor([[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]])  # a group-relative advantage per row
    rollouts = Batch(
        {
            "teacher_log_probs": teacher,
            "old_log_probs": student,
            "response_mask": mask,
            "task_advantages": task,
        }
    )
    got = opd.distillation_advantages(rollouts, reward_weight=2.0)["advantages"]
    # distillation + 2 * task: 1 + 1, -1 + 1, padding 0 | -2 - 1, 0.5 - 1, -7 - 1
    assert got.tolist() == [[2.0, 0.0, 0.0], [-3.0, -0.5, -8.0]]


def test_the_position_baseline_is_the_other_rows_mean_at_each_position():
    teacher = torch.tensor([[-0.5, -2.0, -1.0], [-3.0, -0.25, -9.0], [-1.0, -1.0, -1.0]])
    student = torch.tensor([[-1.5, -1.0, -4.0], [-1.0, -0.75, -2.0], [-1.0, -2.0, -0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    rollouts = Batch({"teacher_log_probs": teacher, "old_log_probs": student, "response_mask": mask})
    # log pi_T - log pi_S: [1, -1, pad] | [-2, 0.5, -7] | [0, pad, pad]
    got = opd.distillation_advantages(rollouts, baseline="position")["advantages"]
    # position 0, three rows: 1 - (-2 + 0) / 2 = 2; -2 - (1 + 0) / 2 = -2.5; 0 - (1 - 2) / 2 = 0.5
    # position 1, two rows: -1 - 0.5 = -1.5; 0.5 - (-1) = 1.5; position 2, one row: no other row, -7 - 0
    assert got.tolist() == [[2.0, -1.5, 0.0], [-2.5, 1.5, -7.0], [0.5, 0.0, 0.0]]
    task = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]])
    mixed = opd.distillation_advantages(rollouts | Batch({"task_advantages": task}), 0.5, "position")
    # the task advantage is added after the baseline, times 0.5, on valid tokens only
    assert mixed["advantages"].tolist() == [[2.5, -1.0, 0.0], [-2.5, 1.5, -7.0], [0.0, 0.0, 0.0]]


def test_the_baseline_key_takes_none_or_position(tmp_path):
    root = write_task(tmp_path)
    data = [f"data.train_files=[{root / 'train.parquet'}]", f"trainer.output_dir={root / 'run'}"]
    assert recipe_settings(load_config(None, data), opd.OpdSettings).baseline == "none"
    config = load_config(None, [*data, "recipe.baseline=position"])
    assert recipe_settings(config, opd.OpdSettings).baseline == "position"
    with pytest.raises(ConfigError, match=r"recipe\.baseline: .*'none', 'position'"):
        recipe_settings(load_config(None, [*data, "recipe.baseline=mean"]), opd.OpdSettings)


def test_the_advantage_needs_both_log_prob_columns():
    rollouts = Batch({"old_log_probs": torch.zeros(1, 2), "response_mask": torch.ones(1, 2)})
    with pytest.raises(KeyError, match="teacher_log_probs"):
        opd.distillation_advantages(rollouts)


# ------------------------------------------------------------------------------ the teacher's checks


def test_a_teacher_with_another_vocabulary_is_refused_naming_both_folders(tmp_path):
    student_tokenizer = build_char_tokenizer()
    student = tmp_path / "student"
    student_tokenizer.save_pretrained(student)
    check_same_vocabulary(student_tokenizer, student, write_teacher(tmp_path / "same"))
    other = write_teacher(tmp_path / "other", alphabet="0123456789+=")
    with pytest.raises(ValueError, match=r"teacher\.path") as error:
        check_same_vocabulary(student_tokenizer, student, other)
    assert str(other) in str(error.value) and str(student) in str(error.value)
    assert "id 4 is '0' in the teacher's" in str(error.value)  # the first id the two tokenizers disagree on


def test_a_teacher_whose_embedding_lacks_ids_is_refused(tmp_path):
    student_tokenizer = build_char_tokenizer()
    short = write_teacher(tmp_path / "short")
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "vocab_size": len(student_tokenizer) - 1}))
    with pytest.raises(ValueError, match=f"embedding holds {len(student_tokenizer) - 1} ids"):
        check_same_vocabulary(student_tokenizer, tmp_path, short)


def test_the_teacher_section_is_checked_key_by_key(tmp_path):
    root = write_task(tmp_path)
    data = [f"data.train_files=[{root / 'train.parquet'}]", f"trainer.output_dir={root / 'run'}"]
    with pytest.raises(ConfigError) as error:
        load_config(None, [*data, "teacher.pth=x", "teacher.forward_micro_batch_size=0"])
    message = str(error.value)
    assert "teacher.pth: unknown key; did you mean 'teacher.path'?" in message
    assert "teacher.forward_micro_batch_size: must be >= 1, got 0" in message
    assert "teacher.path: required" in message
    with pytest.raises(ConfigError, match=r"teacher\.path: directory '/no/such/teacher' not found"):
        load_config(None, [*data, "teacher.path=/no/such/teacher"])
    with pytest.raises(ConfigError, match=r"resource\.placement\.teacher: unknown pool 'elsewhere'"):
        load_config(None, [*data, f"teacher.path={tmp_path}", "resource.placement={teacher: elsewhere}"])


# ------------------------------------------------------------------------------ two steps on Ray


def single_process_log_probs(model_dir: Path, rollouts: Batch, temperature: float) -> torch.Tensor:
    """``[rows, response_len]``: each response token's log-prob under the model in ``model_dir``, one
    unpadded row at a time in this process (0 on padding)."""
    model = load_causal_lm(model_dir)
    out = torch.zeros(rollouts["responses"].shape)
    with torch.no_grad():
        for row in range(len(rollouts)):
            prompt = rollouts["input_ids"][row][rollouts["attention_mask"][row].bool()]
            response = rollouts["responses"][row][rollouts["response_mask"][row].bool()]
            logits = model(torch.cat([prompt, response])[None]).logits[0] / temperature
            predicted = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
            out[row, : len(response)] = predicted.gather(-1, response[:, None])[:, 0]
    return out


def run_opd(root: Path, teacher: Path, extra: list[str]) -> tuple[list[Batch], list[dict], Runtime]:
    """Two OPD steps under `fit` (HF engine, the tiny student of `run_config`); the steps' rollouts,
    the logged records and the (closed) runtime."""
    small = [  # 8 prompts x 4 samples: the test is about the columns, not the learning
        "data.train_batch_size=8",
        "rollout.n=4",
        "actor.ppo_mini_batch_size=32",
        "actor.ppo_micro_batch_size=16",
    ]
    config = run_config(root, "hf", 2, [f"teacher.path={teacher}", "rollout.temperature=1.0", *small, *extra])
    returned: list[Batch] = []

    def step(runtime: Runtime, prompts: Batch) -> Batch:
        rollouts = opd.opd_step(runtime, prompts)
        returned.append(rollouts)
        return rollouts

    with Runtime(config) as runtime:
        fit(runtime, step)
    return returned, read_jsonl(root / "run" / "metrics.jsonl"), runtime


def check_teacher_columns(rollouts: Batch, teacher: Path) -> None:
    mask = rollouts["response_mask"].bool()
    expected = single_process_log_probs(teacher, rollouts, temperature=1.0)
    torch.testing.assert_close(rollouts["teacher_log_probs"][mask], expected[mask], atol=1e-6, rtol=0)
    # Another model than the student: the two disagree by far more than the tolerance.
    assert (rollouts["teacher_log_probs"] - rollouts["old_log_probs"])[mask].abs().max() > 0.1


def test_opd_runs_two_steps_with_the_teacher_colocated(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    teacher = write_teacher(tmp_path / "teacher")
    returned, records, runtime = run_opd(root, teacher, ["recipe.reward_weight=0.5"])
    assert (
        runtime.teacher is not None and runtime.teacher.hosts is runtime.actor.hosts
    )  # one process per slot
    assert [record["step"] for record in records] == [1, 2]
    for rollouts, record in zip(returned, records, strict=True):
        check_teacher_columns(rollouts, teacher)
        mask = rollouts["response_mask"]
        task, _ = compute_advantage(
            {
                "token_level_rewards": rollouts["token_level_scores"],
                "response_mask": mask,
                "group_ids": rollouts["group_ids"],
            },
            "grpo",
        )
        expected = (rollouts["teacher_log_probs"] - rollouts["old_log_probs"] + 0.5 * task) * mask
        torch.testing.assert_close(rollouts["advantages"], expected, atol=1e-6, rtol=0)
        reverse_kl = ((rollouts["old_log_probs"] - rollouts["teacher_log_probs"]) * mask).sum() / mask.sum()
        assert record["opd/reverse_kl"] == pytest.approx(reverse_kl.item(), abs=1e-5)
        assert "actor/pg_loss" in record and "timing_s/teacher" in record


def test_opd_runs_two_steps_with_the_teacher_on_its_own_pool(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    teacher = write_teacher(tmp_path / "teacher")
    pool = [
        "resource.pools={teacher_pool: {nodes: 1, slots_per_node: 1}}",
        "resource.placement={teacher: teacher_pool}",
    ]
    returned, records, runtime = run_opd(root, teacher, pool)
    assert runtime.teacher is not None and runtime.teacher.world_size == 1 and runtime.actor.world_size == 2
    assert [record["step"] for record in records] == [1, 2]
    for rollouts in returned:
        check_teacher_columns(rollouts, teacher)
        mask = rollouts["response_mask"]
        expected = (rollouts["teacher_log_probs"] - rollouts["old_log_probs"]) * mask
        assert torch.equal(rollouts["advantages"], expected)  # no task reward mixed in
