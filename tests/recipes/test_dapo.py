"""recipes/dapo: dynamic sampling keeps only groups of mixed accuracy and refills the batch; over-sampling
fills it in one round; overlong handling."""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import register
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from hybridflow.rewards.shaping import overlong_penalty
from recipes.dapo import main as dapo
from tests.trainer._runs import run_config, write_task
from trainer.config import load_config
from trainer.fit import fit
from trainer.runtime import Runtime
from workers.actor import ActorRolloutRefWorker

GROUP = 4


def scored_round(
    group_scores: list[list[float]], tag: int, prompt_width: int, shaped: list[list[float]] | None = None
) -> Batch:
    """Rows of hand-made groups of GROUP samples: accuracies, shaped scores (the accuracies unless given),
    a tag per row, and prompts ``prompt_width`` wide."""
    accuracy = torch.tensor([s for group in group_scores for s in group])
    scores = accuracy if shaped is None else torch.tensor([s for group in shaped for s in group])
    rows = len(accuracy)
    return Batch(
        {
            "accuracy": accuracy,
            "scores": scores,
            "group_ids": torch.arange(rows) // GROUP,
            "tag": torch.full((rows,), tag) * 100 + torch.arange(rows),
            "input_ids": torch.full((rows, prompt_width), 5),
            "attention_mask": torch.ones(rows, prompt_width, dtype=torch.long),
            "responses": torch.ones(rows, 3, dtype=torch.long),
        }
    )


def test_uniform_groups_never_reach_the_batch_and_it_is_refilled():
    rounds = [
        # all correct, mixed, all wrong, mixed
        scored_round([[1, 1, 1, 1], [1, 0, 0, 1], [0, 0, 0, 0], [0, 0, 1, 0]], tag=1, prompt_width=3),
        # all wrong, mixed, mixed, all wrong
        scored_round([[0, 0, 0, 0], [1, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]], tag=2, prompt_width=5),
        scored_round([[0, 1, 0, 1]] * 4, tag=3, prompt_width=4),
    ]
    calls = []

    def sample_round(index: int) -> Batch:
        calls.append(index)
        return rounds[index]

    batch, metrics = dapo.fill_batch(
        sample_round, groups_wanted=3, group_size=GROUP, max_rounds=4, pad_token_id=0
    )
    assert calls == [0, 1]  # round 1 kept 2 groups, round 2 filled the third and stopped
    # Kept: round 1's groups 1 and 3, then round 2's group 1 (the batch is full: its group 2 is cut).
    assert batch["tag"].tolist() == [104, 105, 106, 107, 112, 113, 114, 115, 204, 205, 206, 207]
    assert batch["group_ids"].tolist() == [0] * 4 + [1] * 4 + [2] * 4
    for group in batch["scores"].view(3, GROUP):
        assert group.max() > group.min()
    # Prompts of both rounds left-padded to the widest (5): round 1's rows gained 2 pad columns.
    assert batch["input_ids"].shape == (12, 5)
    assert batch["attention_mask"][:8].tolist() == [[0, 0, 1, 1, 1]] * 8
    assert metrics == {
        "dapo/rounds": 2.0,
        "dapo/prompts_sampled": 8.0,
        "dapo/prompts_kept": 3.0,
        "dapo/kept_fraction": 4 / 8,
    }


def test_groups_are_kept_by_accuracy_not_by_shaped_scores():
    rows = scored_round(
        [[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]],
        tag=1,
        prompt_width=2,
        # Group 0: all correct, but the overlong punishment split it (one long answer, 1 - 0.5).
        # Group 1: one correct, shaped scores as varied as its accuracies. Group 2: all wrong and all long.
        shaped=[[1, 0.5, 1, 1], [1, 0, -0.5, 0], [-1, -1, -1, -1]],
    )
    kept = dapo.informative_groups(rows)
    assert kept["tag"].tolist() == [104, 105, 106, 107]
    # The rule on the shaped scores would have kept group 0, whose advantage is length alone.
    shaped = rows["scores"].view(3, GROUP)
    assert (shaped.max(-1).values > shaped.min(-1).values).tolist() == [True, True, False]


def test_over_sampling_fills_the_step_from_one_round():
    """Prompt batches of 4 prompts; one prompt in 4 gives a group of mixed accuracy (the others are all
    right or all wrong). A step wants 4 groups: one batch per round needs 4 rounds, three per round need
    2, and four per round fill the step from its first round."""
    prompt_batches = iter(range(1, 100))

    def prompts(batch_index: int) -> Batch:
        ids = torch.full((4, 2), batch_index)
        return Batch({"input_ids": ids, "attention_mask": torch.ones(4, 2, dtype=torch.long)})

    def sample_round(round_prompts: Batch) -> Batch:
        # Prompt j of every batch: j == 1 is mixed (1 right of GROUP), j == 0 all right, else all wrong.
        groups = [[1, 0, 0, 0] if j % 4 == 1 else [int(j % 4 == 0)] * GROUP for j in range(len(round_prompts))]
        return scored_round(groups, tag=int(round_prompts["input_ids"][0, 0]), prompt_width=2)

    def rounds_needed(oversample: int) -> tuple[float, list[int]]:
        nonlocal prompt_batches
        prompt_batches = iter(range(1, 100))
        first = prompts(0)
        sizes = []

        def one_round(index: int) -> Batch:
            joined = dapo.round_prompts(
                first if index == 0 else None, lambda: prompts(next(prompt_batches)), oversample, 0
            )
            sizes.append(len(joined))
            return sample_round(joined)

        batch, metrics = dapo.fill_batch(one_round, groups_wanted=4, group_size=GROUP, max_rounds=8, pad_token_id=0)
        assert batch is not None and len(batch) == 4 * GROUP
        return metrics["dapo/rounds"], sizes

    assert rounds_needed(1) == (4.0, [4, 4, 4, 4])
    assert rounds_needed(3) == (2.0, [12, 12])
    assert rounds_needed(4) == (1.0, [16])
    # The first round holds the step's own prompts (batch 0) and then the next batches, in order.
    joined = dapo.round_prompts(prompts(0), lambda: prompts(7), 3, 0)
    assert joined["input_ids"][:, 0].tolist() == [0] * 4 + [7] * 8


def test_the_rounds_are_capped_and_nothing_informative_gives_no_batch():
    uniform = scored_round([[1, 1, 1, 1], [0, 0, 0, 0]], tag=1, prompt_width=2)
    batch, metrics = dapo.fill_batch(
        lambda _: uniform, groups_wanted=2, group_size=GROUP, max_rounds=3, pad_token_id=0
    )
    assert batch is None
    assert metrics["dapo/rounds"] == 3 and metrics["dapo/prompts_sampled"] == 6
    assert metrics["dapo/prompts_kept"] == 0 and metrics["dapo/kept_fraction"] == 0


def test_overlong_punishment_of_the_recipe_config_at_its_boundaries(tmp_path):
    files = [f"data.train_files=[{write_task(tmp_path) / 'train.parquet'}]", "data.val_files=[]", "trainer.val_every=0"]
    config = load_config(dapo.HERE / "config.yaml", files)
    settings = dapo.dapo_settings(config)
    assert config.reward.shaping == () and settings.oversample == 3
    assert (config.data.max_response_length, settings.overlong_cache_length) == (6, 2)
    lengths = torch.tensor([1, 4, 5, 6])  # up to L_max - L_cache = 4: 0; then (4 - L) / 2; -1 at L_max
    mask = (torch.arange(6) < lengths[:, None]).long()
    shaped = overlong_penalty(
        torch.ones(4),
        Batch({"response_mask": mask}),
        max_response_length=config.data.max_response_length,
        cache_length=settings.overlong_cache_length,
    )
    assert shaped.tolist() == [1.0, 1.0, 0.5, 0.0]
    # A configured shaping would change the accuracy the groups are kept by: refused, naming the key.
    shaped_config = load_config(
        dapo.HERE / "config.yaml",
        [*files, "reward.shaping=[{name: length_penalty, kwargs: {coef: 0.1, max_response_length: 6}}]"],
    )
    with pytest.raises(ValueError, match=r"reward.shaping must be empty, got \['length_penalty'\]"):
        dapo.dapo_settings(shaped_config)


def test_truncated_samples_carry_no_loss():
    rows = Batch(
        {"response_mask": torch.ones(3, 4, dtype=torch.long)}, {"finish_reason": ["stop", "length", "stop"]}
    )
    assert dapo.without_truncated_tokens(rows)["response_mask"].sum(-1).tolist() == [4, 0, 4]


class RowCountingActor(ActorRolloutRefWorker):
    """Records how many rows, and which columns, each update receives on this rank."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[int] = []
        self.columns: list[list[str]] = []

    def update_actor(self, batch: Batch, **kwargs) -> dict[str, float]:
        self.rows.append(len(batch))
        self.columns.append(sorted(batch.keys()))
        return super().update_actor(batch, **kwargs)

    @register(dispatch="one_to_all")
    def rows_per_update(self) -> list[int]:
        return self.rows

    @register(dispatch="rank_zero")
    def columns_per_update(self) -> list[list[str]]:
        return self.columns


def test_dapo_step_under_fit_trains_only_on_informative_groups(ray_cluster, tmp_path):
    # The "write 7" task scores the share of 7s: a random policy's group is all-zero about 1 time in 9,
    # so some rounds drop groups and sample again.
    root = write_task(tmp_path)
    config = run_config(root, "hf", 2, ["recipe.max_rounds=4", "actor.clip_eps_high=0.28"])
    trained: list[Batch] = []

    def step(runtime, prompts):
        rollouts = dapo.dapo_step(runtime, prompts)
        trained.append(rollouts)
        return rollouts

    with Runtime(config, worker_classes={"actor_rollout": RowCountingActor}) as runtime:
        fit(runtime, step)
        rows = runtime.actor.rows_per_update()
        columns = runtime.actor.columns_per_update()
    records = read_jsonl(root / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    # Both updates trained on the whole kept batch (16 groups of 8, split over 2 ranks) ...
    assert [sum(per_rank) for per_rank in zip(*rows, strict=True)] == [128, 128]
    for rollouts, sent in zip(trained, columns, strict=True):
        # The response mask that overlong filtering changed (a truncated sample's mask is all zero now)
        # went along with the tokens, so no truncated token was trained on.
        assert {"advantages", "responses", "response_mask"} <= set(sent)
        # ... and no group of it had the same accuracy on every sample.
        accuracy = rollouts["accuracy"].view(16, 8)
        assert bool((accuracy.max(-1).values > accuracy.min(-1).values).all())
        assert rollouts["group_ids"].tolist() == [g for g in range(16) for _ in range(8)]
    for record in records:
        assert record["dapo/prompts_kept"] == 16
        # Over-sampling (3 batches of 16 prompts a round) filled each step from its first round.
        assert record["dapo/rounds"] == 1
        assert record["dapo/prompts_sampled"] == 48
        assert record["group/zero_variance_frac"] == 0.0
