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
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from hybridflow.controller import register
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
def run(ray_cluster, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp("length_bias"), prompts=2 * PROMPTS)
    write_long_tail_model(root / "model")
    config = run_config(
        root, "hf", STEPS, [*SETTINGS, f"model.path={root / 'model'}", f"trainer.output_dir={root / 'run'}"]
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
