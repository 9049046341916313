"""On-policy distillation (OPD): the student samples, a frozen teacher scores every sampled token, and
each token's advantage is the negative per-token reverse-KL estimate::

    A_t = log pi_T(y_t | x, y_<t) - log pi_S(y_t | x, y_<t)      (+ w * task-reward advantage)

Sampling from the student and minimising the reverse KL KL(pi_S || pi_T) on those samples is the
"on-policy" objective of Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD, arXiv:2306.13649, with the reverse KL as the divergence); writing the
single-sample estimate ``log pi_S - log pi_T`` of each token as a negative per-token reward that a policy
gradient maximises (no discounting: each token answers for itself) follows Thinking Machines Lab's
"On-Policy Distillation" (Lu et al., 2025). ``recipe.reward_weight`` > 0 adds the task reward's
group-relative (GRPO) advantage, times the weight, to every token of the row.

The teacher is the library's ``teacher`` role (docs/distillation.md): by default the arithmetic demo's
supervised warm start, trained once and cached (`prepare_teacher`); ``teacher.path=<folder>`` picks
another model with the student's tokenizer.

Run:  python -m recipes.opd.main [key=value overrides of config.yaml]
(or python recipes/opd/main.py ...)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from hybridflow.algos import masked_mean
from hybridflow.contract import step_columns
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.protocol import Batch
from recipes.arithmetic_demo.main import CACHE, WARM_START, demo_config
from trainer.config import load_config, recipe_field, recipe_settings
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import advantages, generate, old_log_probs, score, teacher_log_probs, update_actor
from trainer.warm_start import warm_started_model

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/opd/data")  # config.yaml's data.train_files / val_files point here


Baseline = Literal["none", "position"]


@dataclass(frozen=True)
class OpdSettings:
    """``recipe.*`` keys: the weight of the task reward's GRPO advantage (0 distils alone), and the
    baseline subtracted from each token's distillation advantage (`position_baseline`; ``none``: the
    bare ``log pi_T - log pi_S``)."""

    reward_weight: float = recipe_field(0.0, ge=0)
    baseline: Baseline = "none"


def position_baseline(advantage: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[batch, response_len]``: at each row and response position, the mean of ``advantage`` over the
    *other* rows that have a token at that position (leave-one-out; 0 where no other row has one).

    Subtracted from a token's advantage it leaves the policy gradient's expectation unchanged, since
    the other rows are samples independent of this row's token, and removes what every sample at that
    position shares: the position's mean reverse KL (recipes/opd/README.md, "Why OPD did not lower the
    reverse KL"). ``advantage`` is 0 wherever ``mask`` is.
    """
    weight = mask.to(advantage.dtype)
    total = (advantage * weight).sum(dim=0, keepdim=True)  # [1, response_len]
    count = weight.sum(dim=0, keepdim=True)
    others = (count - weight).clamp(min=1)  # rows besides this one at the position (>= 1 to divide)
    return (total - advantage * weight) / others * (count - weight > 0)


@step_columns(reads=("teacher_log_probs", "old_log_probs", "response_mask"), writes=("advantages",))
def distillation_advantages(rollouts: Batch, reward_weight: float = 0.0, baseline: Baseline = "none") -> Batch:
    """``advantages [batch, response_len]``: ``teacher_log_probs - old_log_probs`` at each response token
    (nats; 0 on padding), less `position_baseline` of it when ``baseline`` is ``position``, plus
    ``reward_weight`` times the batch's ``task_advantages [batch, response_len]`` (the task reward's,
    from `trainer.steps.advantages`) when ``reward_weight`` > 0."""
    mask = rollouts["response_mask"]
    distill = (rollouts["teacher_log_probs"] - rollouts["old_log_probs"]) * mask
    if baseline == "position":
        distill = (distill - position_baseline(distill, mask)) * mask
    if reward_weight > 0:
        distill = distill + reward_weight * rollouts["task_advantages"] * mask
    return Batch({"advantages": distill})


def opd_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One OPD step: the student samples, the teacher scores its tokens, a policy-gradient update."""
    settings = recipe_settings(runtime.config, OpdSettings)
    rollouts = generate(runtime, prompts)  # y ~ pi_S(. | x), inference layout
    rollouts |= old_log_probs(runtime, rollouts)  # log pi_S(y_t | x, y_<t), training layout
    rollouts |= teacher_log_probs(runtime, rollouts)  # log pi_T(y_t | x, y_<t), frozen teacher
    rollouts |= score(runtime, rollouts)  # the task reward: reported, and mixed in when w > 0
    if settings.reward_weight > 0:
        task = advantages(runtime, rollouts)["advantages"]  # GRPO on the task reward
        rollouts |= Batch({"task_advantages": task})
    # A_t = log pi_T - log pi_S (- the other rows' mean at t) (+ w A)
    rollouts |= distillation_advantages(rollouts, settings.reward_weight, settings.baseline)
    mask = rollouts["response_mask"]
    runtime.record(
        {
            "opd/reverse_kl": masked_mean(
                rollouts["old_log_probs"] - rollouts["teacher_log_probs"], mask
            ).item(),
            "opd/teacher_log_prob": masked_mean(rollouts["teacher_log_probs"], mask).item(),
            "opd/student_log_prob": masked_mean(rollouts["old_log_probs"], mask).item(),
        }
    )
    update_actor(runtime, rollouts)  # maximise sum_t A_t log pi_S(y_t | ...)
    return rollouts


def prepare_teacher(overrides: Sequence[str]) -> list[str]:
    """``overrides``, with ``teacher.path`` set to the arithmetic demo's warm start (trained on first use,
    then cached under .cache/arithmetic_demo) unless they set it."""
    if any(item.startswith(("teacher.path=", "teacher=")) for item in overrides):
        return list(overrides)
    demo_data = ensure_arithmetic_splits(CACHE / "data")
    teacher, accuracy = warm_started_model(demo_config(demo_data, 0, []), CACHE, WARM_START)
    logging.getLogger(__name__).warning(
        "teacher: %s (%.1f%% held-out greedy accuracy)", teacher, 100 * accuracy
    )
    return [f"teacher.path={teacher}", *overrides]


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_arithmetic_splits(DATA)  # 2-digit addition, bare style ("47+38=" -> "85")
    config = load_config(HERE / "config.yaml", prepare_teacher(overrides))
    recipe_settings(config, OpdSettings)  # a bad recipe.* key fails here, before anything starts
    if config.teacher is None:
        raise SystemExit("recipes/opd: the run needs a teacher; give teacher.path=<model folder>")
    with start_ray(config), Runtime(config) as runtime:
        return fit(runtime, opd_step)


if __name__ == "__main__":
    main(sys.argv[1:])
