"""recipes/re2's step function under fit, on real Ray workers (HF engine, a tiny random model).

A random policy never writes the paper's redo phrase, so the run uses a one-character phrase, "q", which
it writes now and then, and a reward on the first character of the whole sample, for which about half of
random samples score 1. What must hold:

- the update trains on the kept rows only, and no kept prefix group has equal rewards;
- the reward judges the whole sample: every row's text starts with its prefix's;
- a response holding the phrase ends right after it with an appended EOS, which carries loss, and the
  engine-vs-trainer log-prob gap stays that of the sampled tokens;
- every continuation's prompt ends with its prefix.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hybridflow.controller import register
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from recipes.re2 import main as re2
from tests.trainer._runs import run_config, write_task
from trainer.config import recipe_settings
from trainer.fit import fit
from trainer.runtime import Runtime
from workers.actor import ActorRolloutRefWorker

REWARD = '''
def first_char_even(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the sample's first character has an even code: about half of random samples."""
    return float(bool(solution_str) and ord(solution_str[0]) % 2 == 0)
'''


class RowCountingActor(ActorRolloutRefWorker):
    """Records how many rows each update receives on this rank."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rows: list[int] = []

    def update_actor(self, batch: Batch, **kwargs) -> dict[str, float]:
        self.rows.append(len(batch))
        return super().update_actor(batch, **kwargs)

    @register(dispatch="one_to_all")
    def rows_per_update(self) -> list[int]:
        return self.rows


def test_re2_step_under_fit(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    (root / "reward.py").write_text(REWARD)
    config = run_config(
        root,
        "hf",
        2,
        [
            "data.train_batch_size=4",
            "data.max_prompt_length=16",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=16",
            "actor.ppo_micro_batch_size=8",
            "recipe.continuations=4",
            "recipe.redo_phrase=q",
            "recipe.max_rounds=2",
        ],
        reward_fn="first_char_even",
    )
    trained: list[Batch] = []

    def step(runtime, prompts):
        rollouts = re2.re2_step(runtime, prompts)
        trained.append(rollouts)
        return rollouts

    with Runtime(config, worker_classes={"actor_rollout": RowCountingActor}) as runtime:
        fit(runtime, step)
        rows = runtime.actor.rows_per_update()
        eos = runtime.tokenizer.eos_token_id
        tokenizer = runtime.tokenizer

        def decode(ids: list[int]) -> str:
            return tokenizer.decode(ids, skip_special_tokens=True)

        phrase = runtime.tokenizer.convert_tokens_to_ids("q")
        settings = recipe_settings(config, re2.Re2Settings)
        # At temperature 3 the random policy writes "q" often: there are redos to ask again.
        once = re2.redo_validation(runtime, replace(settings, val_restarts=0, val_temperature=3.0), samples=4)
        restarted = re2.redo_validation(runtime, replace(settings, val_restarts=3, val_temperature=3.0), samples=4)
    records = read_jsonl(root / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert [sum(per_rank) for per_rank in zip(*rows, strict=True)] == [len(b) for b in trained]
    redone = 0
    for rollouts in trained:
        assert rollouts["group_ids"].shape == (len(rollouts), 2)
        for group in rollouts["group_ids"].unique(dim=0):
            rows_of_group = (rollouts["group_ids"] == group).all(dim=1)
            scores = rollouts["scores"][rows_of_group]
            assert scores.max() > scores.min()
        width = rollouts["responses"].shape[1]
        for row in range(len(rollouts)):
            k = int(rollouts["prefix_lengths"][row])
            assert (
                rollouts["input_ids"][row, rollouts["input_ids"].shape[1] - k :].tolist()
                == rollouts["prefix_tokens"][row, :k].tolist()
            )
            # The reward judged the whole sample: the prefix's text, then the continuation's.
            assert rollouts["response_text"][row].startswith(
                decode(rollouts["prefix_tokens"][row, :k].tolist())
            )
            length = int(rollouts["response_lengths"][row])
            response = rollouts["responses"][row, :length].tolist()
            # The whole sample (prefix, then response) stays within the first stage's width.
            assert k + length <= width
            if phrase in response:  # cut right after the first "q", then EOS where the row has room
                redone += 1
                end = response.index(phrase) + 1
                if end < width - k:
                    assert length == end + 1 and response[-1] == eos
                else:
                    assert length == end == width - k
                assert bool(rollouts["redo"][row]) and rollouts["response_mask"][row, length - 1] == 1
        assert rollouts["appended_eos"].sum() <= rollouts["redo"].sum()
    assert redone > 0
    for record in records:
        assert {"re2/redo_rate", "re2/continuation/redo_rate", "re2/rounds", "re2/generated_tokens"} <= set(
            record
        )
        # fp32 HF engine and trainer: the appended EOS (never sampled) does not enter the gap.
        assert record["sync/log_prob_abs_diff_max"] < 1e-3
    assert torch.cat([b["scores"] for b in trained]).unique().numel() > 2  # 0, 1 and redo rewards
    # Test-time restarts. Without them the first attempt stands; the same seeds give the same first attempts.
    assert once["val_re2/redo_rate"] == restarted["val_re2/redo_rate"] > 0
    assert once["val_re2/attempts_mean"] == 1.0
    assert once["val_re2/accuracy_restarts"] == once["val_re2/accuracy_first_attempt"]
    assert once["val_re2/unanswered_rate"] == once["val_re2/redo_rate"]
    # With them every first redo is asked again at least once, and some answer: the unanswered share falls.
    assert restarted["val_re2/attempts_mean"] >= 1.0 + restarted["val_re2/redo_rate"]
    assert restarted["val_re2/unanswered_rate"] < restarted["val_re2/redo_rate"]
    assert restarted["val_re2/accuracy_restarts"] >= restarted["val_re2/accuracy_first_attempt"]
