"""A reward model as a reward source in training: real Ray, gloo, FSDP2 and the HF engine on 2 CPU ranks.

The run's scores are checked row by row against a single-process reference: the reward function
computed here plus ``reward_model.weight`` times the Hugging Face classifier's output at the last token
of the same prompt + response tokens, each row run alone and unpadded. Dropping the weight, reading
the score at another token, letting padding into the forward or mixing up the rows would each move a
score by far more than the tolerance (the model's scores spread over ~1, checked below).
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hybridflow.algos import last_valid_token_mask
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from tests.trainer._runs import fraction_of_target, run_config, write_task
from tests.workers._policy import write_reward_model
from trainer.algorithms import rl_step
from trainer.fit import Progress, fit
from trainer.runtime import Runtime
from trainer.validation import validation_metrics, validation_rollouts

STEPS = 2
WEIGHT = 0.5
# fp32 sums in another order (packed, sharded) moved reward-model scores by at most ~1.4e-6 in the
# worker's own test; a wrong token or padding in the attention moves them by ~1e-2 or more.
ATOL = 1e-5
_ROW_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask", "response_text")


_SCORE_COLUMNS = ("scores", "token_level_scores", "rule_scores", "rm_scores")


class ScoreRecorder:
    """Keeps the rows and the scores of every scoring: the validation's, then one per step."""

    def __init__(self) -> None:
        self.scored: list[tuple[Batch, Batch]] = []

    def keep(self, rollouts: Batch) -> None:
        self.scored.append((rollouts.select(*_ROW_COLUMNS, meta=False), rollouts.select(*_SCORE_COLUMNS, meta=False)))

    def validate(self, runtime: Runtime, progress: Progress) -> dict[str, float]:
        batches = list(validation_rollouts(runtime))
        for batch in batches:
            self.keep(batch)
        return validation_metrics(batches)

    def step(self, runtime: Runtime, prompts: Batch) -> Batch:
        rollouts = rl_step(runtime, prompts)
        self.keep(rollouts)
        return rollouts


def reference_rm_scores(rm_dir, rows: Batch) -> torch.Tensor:
    """The classifier's head at the last token of each row's prompt + response, run alone and unpadded."""
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, local_files_only=True).eval()
    scores = []
    with torch.no_grad():
        for i in range(len(rows)):
            ids = torch.cat(
                [
                    rows["input_ids"][i][rows["attention_mask"][i].bool()],
                    rows["responses"][i][rows["response_mask"][i].bool()],
                ]
            )
            hidden = model.model(input_ids=ids.unsqueeze(0)).last_hidden_state
            scores.append(model.score(hidden)[0, -1, 0])
    return torch.stack(scores)


@pytest.fixture(scope="module")
def rm_run(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("rm_run"))
    rm_dir = write_reward_model(root / "reward_model")
    config = run_config(
        root,
        # The HF engine: the scores are checked against the rows the engine sampled, whichever engine
        # that is, and two vLLM engines' start was most of this file's time (vLLM runs in test_end_to_end).
        "hf",
        STEPS,
        [
            f"reward_model.path={rm_dir}",
            f"reward_model.weight={WEIGHT}",
            "reward_model.forward_micro_batch_size=16",
            "trainer.val_before_train=true",
            "actor.param_dtype=float32",
        ],
    )
    recorder = ScoreRecorder()
    with Runtime(config) as runtime:
        fit(runtime, recorder.step, evaluate=recorder.validate)
    return rm_dir, recorder.scored, read_jsonl(root / "run" / "metrics.jsonl")


def test_scores_are_the_rule_score_plus_the_weighted_reward_model_score(rm_run):
    rm_dir, scored, _ = rm_run
    # validation (16 prompts, 1 greedy sample) and STEPS steps of 16 prompts x 8 samples
    assert [len(rows) for rows, _ in scored] == [16] + [128] * STEPS
    for rows, out in scored:
        rule = torch.tensor([fraction_of_target(text) for text in rows["response_text"]])
        model = reference_rm_scores(rm_dir, rows)
        assert model.std() > 0.1, "rows must score differently for the comparison to mean anything"
        torch.testing.assert_close(out["rm_scores"], model, rtol=0, atol=ATOL)
        torch.testing.assert_close(out["rule_scores"], rule, rtol=0, atol=1e-7)
        torch.testing.assert_close(out["scores"], rule + WEIGHT * model, rtol=0, atol=ATOL)
        # The estimators read the token-level scores: the combined score sits on the last response token.
        last = last_valid_token_mask(rows["response_mask"]).float()
        torch.testing.assert_close(
            out["token_level_scores"], last * out["scores"].unsqueeze(-1), rtol=0, atol=0
        )


def test_logged_metrics_carry_the_combined_and_the_model_scores(rm_run):
    _, scored, records = rm_run
    assert [r["step"] for r in records] == list(range(STEPS + 1))
    val, steps = records[0], {r["step"]: r for r in records[1:]}
    val_out = scored[0][1]
    assert val["val/score_mean"] == pytest.approx(val_out["scores"].mean().item(), abs=1e-6)
    assert val["val/model_score_mean"] == pytest.approx(val_out["rm_scores"].mean().item(), abs=1e-6)
    # accuracy stays the reward function's: the task's scores are fractions, never 1 for a random policy
    assert val["val/accuracy"] == pytest.approx((val_out["rule_scores"] >= 1).float().mean().item())
    for step, (_, out) in enumerate(scored[1:], start=1):
        record = steps[step]
        assert record["score/mean"] == pytest.approx(out["scores"].mean().item(), abs=1e-6)
        assert record["reward/model_mean"] == pytest.approx(out["rm_scores"].mean().item(), abs=1e-6)
        assert record["reward/model_std"] == pytest.approx(
            out["rm_scores"].std(unbiased=False).item(), abs=1e-6
        )
        assert record["reward/model_max"] == pytest.approx(out["rm_scores"].max().item(), abs=1e-6)
        assert record["reward/model_min"] == pytest.approx(out["rm_scores"].min().item(), abs=1e-6)
        # the reward manager's own statistics stay those of the reward function
        assert record["reward/score_mean"] == pytest.approx(out["rule_scores"].mean().item(), abs=1e-6)
        assert record["reward/model_time_s"] > 0
