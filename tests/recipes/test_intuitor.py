"""recipes/intuitor: GRPO advantages on self-certainty, and no gold answer anywhere in training."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.controller import register
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from recipes.intuitor import main as intuitor
from tests.trainer._runs import run_config, write_task
from trainer.config import AlgorithmConfig
from trainer.fit import fit
from trainer.runtime import Runtime
from trainer.steps import compute_advantages
from workers.actor import ActorRolloutRefWorker


def test_the_advantage_is_grpo_on_hand_computed_self_certainties():
    # Per-token self-certainty (nats) of 5 responses in groups of 3 and 2; the mask leaves lengths 2, 3, 1, 2, 3.
    certainty = torch.tensor(
        [[1.0, 3.0, 9.0], [2.0, 2.0, 5.0], [4.0, 7.0, 7.0], [0.5, 1.5, 8.0], [3.0, 0.0, 3.0]]
    )
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    rollouts = Batch(
        {"self_certainty": certainty, "response_mask": mask, "group_ids": torch.tensor([0, 0, 0, 1, 1])}
    )
    scored = intuitor.self_certainty_scores(rollouts)
    u = [2.0, 3.0, 4.0, 1.0, 2.0]  # (1+3)/2, (2+2+5)/3, 4/1, (0.5+1.5)/2, (3+0+3)/3
    assert scored["scores"].tolist() == u
    # The score sits at each response's last token, as a reward function's would.
    assert scored["token_level_scores"].tolist() == [[0, 2, 0], [0, 0, 3], [4, 0, 0], [0, 1, 0], [0, 0, 2]]
    advantages = compute_advantages(rollouts | scored, AlgorithmConfig(adv_estimator="grpo"))["advantages"]
    # Group 0: mean 3, Bessel std 1 -> -1, 0, 1. Group 1: mean 1.5, std sqrt(0.5) -> -/+ 0.5 / sqrt(0.5).
    expected = [
        -1 / (1 + 1e-6),
        0.0,
        1 / (1 + 1e-6),
        -0.5 / (math.sqrt(0.5) + 1e-6),
        0.5 / (math.sqrt(0.5) + 1e-6),
    ]
    torch.testing.assert_close(advantages, torch.tensor(expected)[:, None] * mask, atol=1e-6, rtol=0)


def test_labelled_grpo_is_the_external_advantage_alone_and_the_weights_add():
    # 4 responses in groups of 2; exact-match scores 1, 0 | 0, 0 at each response's last token.
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1]])
    rollouts = Batch({"response_mask": mask, "group_ids": torch.tensor([0, 0, 1, 1])})
    external = Batch({"token_level_scores": torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])})
    certainty = torch.tensor([[3.0, 3.0], [-2.0, 0.0], [0.5, 0.5], [-0.5, -0.5]])
    # Group 0: scores 1, 0 -> mean 0.5, Bessel std sqrt(0.5) -> +/- 0.5 / sqrt(0.5); group 1 all equal -> 0.
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    grpo = torch.tensor([[a, a], [-a, 0.0], [0.0, 0.0], [0.0, 0.0]])
    labelled = intuitor.IntuitorSettings(self_certainty_weight=0.0, external_reward_weight=1.0)
    got = intuitor.combined_advantages(certainty, external, rollouts, labelled)
    torch.testing.assert_close(got, grpo, atol=1e-6, rtol=0)
    mixed = intuitor.IntuitorSettings(self_certainty_weight=0.5, external_reward_weight=2.0)
    got = intuitor.combined_advantages(certainty, external, rollouts, mixed)
    torch.testing.assert_close(got, 0.5 * certainty + 2.0 * grpo, atol=1e-6, rtol=0)
    label_free = intuitor.IntuitorSettings()
    assert intuitor.combined_advantages(certainty, None, rollouts, label_free).equal(certainty)
    with pytest.raises(ValueError, match=r"recipe\.self_certainty_weight and recipe\.external_reward_weight"):
        intuitor.IntuitorSettings(self_certainty_weight=0.0)


class ColumnRecordingActor(ActorRolloutRefWorker):
    """Records the columns of every Batch the actor receives (rank 0)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[str, list[str]]] = []

    def generate_sequences(self, prompts: Batch, sampling) -> Batch:
        self.seen.append(("generate_sequences", sorted(prompts.keys())))
        return super().generate_sequences(prompts, sampling)

    def update_actor(self, batch: Batch, **kwargs) -> dict[str, float]:
        self.seen.append(("update_actor", sorted(batch.keys())))
        return super().update_actor(batch, **kwargs)

    @register(dispatch="rank_zero")
    def columns_seen(self) -> list[tuple[str, list[str]]]:
        return self.seen


def test_intuitor_trains_without_ever_handling_an_answer(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    # One rank: which columns the worker is sent does not depend on how many ranks share them.
    config = run_config(
        root, "hf", 2, ["actor.use_kl_loss=true", "actor.kl_loss_coef=0.005", "resource.slots_per_node=1"]
    )
    returned = []

    def step(runtime, prompts):
        rollouts = intuitor.intuitor_step(runtime, prompts)
        returned.append(sorted(rollouts.keys()))
        return rollouts

    with Runtime(config, worker_classes={"actor_rollout": ColumnRecordingActor}) as runtime:
        fit(runtime, step)
        seen = runtime.actor.columns_seen()
    update_columns = [columns for method, columns in seen if method == "update_actor"]
    # The token columns travel with the batch, with what the loss reads.
    update = ["advantages", "attention_mask", "input_ids", "old_log_probs", "ref_log_probs", "response_mask", "responses"]
    assert update_columns == [update] * 2
    for method, columns in seen:
        assert "ground_truth" not in columns, method
    for columns in returned:
        assert "ground_truth" not in columns and "self_certainty" in columns
    records = read_jsonl(root / "run" / "metrics.jsonl")
    for record in records:
        # The training score is self-certainty (positive nats), not the task's reward.
        assert record["score/mean"] == pytest.approx(record["intuitor/self_certainty_mean"], rel=1e-6)
        assert record["score/mean"] > 0
        assert record["actor/kl_loss"] >= 0
