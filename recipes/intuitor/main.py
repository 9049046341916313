"""INTUITOR (Zhao et al. 2025, "Learning to Reason without External Rewards", arXiv 2505.19590): GRPO whose
only reward is the policy's own self-certainty, with no gold labels in training.

Self-certainty of a response is the mean over its tokens of KL(U || p_t), per token
``logsumexp(z) - mean_v z_v - log |V|`` (`hybridflow.parallel.token_stats`, "self_certainty"): how far each
next-token prediction is from uniform. It is computed online, by the current policy, in the same forward as
the old log-probs. Advantages are GRPO's on it; the loss keeps a k3 KL to the reference (beta 0.005).
Ground-truth answers are dropped before generation and only validation (`trainer.validation.validate`) scores
against them. ``recipe.external_reward_weight`` > 0 adds the config's reward functions as a second,
separately normalised advantage (and then the labels are used in training); with
``recipe.self_certainty_weight: 0`` and an external weight of 1 the step is GRPO with labels, computing and
logging self-certainty all the same (the labelled side of a comparison, `benchmarks/bench_intuitor_smollm2.py`).

Run:  python -m recipes.intuitor.main [key=value overrides of config.yaml]
(or python recipes/intuitor/main.py ...)
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from hybridflow.algos import compute_advantage, last_valid_token_mask, masked_mean
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.protocol import Batch
from trainer.config import load_config, recipe_field, recipe_settings
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import advantages, generate, old_log_probs, ref_log_probs, score, update_actor

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/intuitor/data")  # config.yaml's data.train_files / val_files point here
LABEL_COLUMNS = ("ground_truth",)
"""Prompt columns that carry the answer: never part of a label-free training step."""


@dataclass(frozen=True)
class IntuitorSettings:
    """``recipe.*`` keys: the weights of the two advantages summed into the update, self-certainty's and the
    external (labelled) reward's; an external weight of 0 trains label-free."""

    self_certainty_weight: float = recipe_field(1.0, ge=0)
    external_reward_weight: float = recipe_field(0.0, ge=0)

    def __post_init__(self) -> None:
        if self.self_certainty_weight == 0 and self.external_reward_weight == 0:
            raise ValueError(
                "recipe.self_certainty_weight and recipe.external_reward_weight are both 0: every advantage "
                "would be 0; set one of them above 0"
            )


def without_labels(batch: Batch) -> Batch:
    """``batch`` without the columns that hold gold answers."""
    return batch.select(*[key for key in batch.keys() if key not in LABEL_COLUMNS])


def self_certainty_scores(rollouts: Batch) -> Batch:
    """``scores [batch]``: each response's mean per-token self-certainty (nats), and ``token_level_scores
    [batch, response_len]`` holding it at the last response token, as a reward function's score would be."""
    mask = rollouts["response_mask"]
    certainty = masked_mean(rollouts["self_certainty"], mask, dim=-1)
    return Batch({"scores": certainty, "token_level_scores": certainty[:, None] * last_valid_token_mask(mask)})


def combined_advantages(
    certainty_advantages: Tensor, external: Batch | None, rollouts: Batch, settings: IntuitorSettings
) -> Tensor:
    """``[batch, response_len]``: ``self_certainty_weight`` times the advantages on self-certainty, plus
    ``external_reward_weight`` times GRPO's advantages on the reward functions' ``token_level_scores`` in
    ``external`` (normalised within each group on their own; None when that weight is 0)."""
    total = settings.self_certainty_weight * certainty_advantages
    if external is None:
        return total
    external_advantages, _ = compute_advantage(
        {
            "token_level_rewards": external["token_level_scores"],
            "response_mask": rollouts["response_mask"],
            "group_ids": rollouts["group_ids"],
        },
        "grpo",
    )
    return total + settings.external_reward_weight * external_advantages


def intuitor_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One INTUITOR step: sample, score by self-certainty, GRPO advantages, update with KL to the reference."""
    settings = recipe_settings(runtime.config, IntuitorSettings)
    if settings.external_reward_weight == 0:
        prompts = without_labels(prompts)  # nothing below can see an answer
    rollouts = generate(runtime, prompts)  # G samples per prompt (vLLM, inference layout)
    rollouts |= old_log_probs(runtime, rollouts, stats=("log_prob", "self_certainty"))  # one forward
    rollouts |= self_certainty_scores(rollouts)  # u_i = mean_t KL(U || pi(. | q, o_<t))
    rollouts |= ref_log_probs(runtime, rollouts)  # for beta * KL(pi || pi_ref) in the loss
    rollouts |= advantages(runtime, rollouts)  # (u_i - mean_group(u)) / std_group(u)
    runtime.record({"intuitor/self_certainty_mean": rollouts["scores"].mean().item()})
    external = score(runtime, rollouts) if settings.external_reward_weight > 0 else None
    total = combined_advantages(rollouts.pop("advantages")["advantages"], external, rollouts, settings)
    rollouts = without_labels(rollouts) | Batch({"advantages": total})
    update_actor(runtime, rollouts)  # clipped surrogate + 0.005 * k3 KL to pi_ref (config)
    return rollouts


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ensure_arithmetic_splits(DATA)  # 2-digit addition, bare style ("47+38=" -> "85")
    config = load_config(HERE / "config.yaml", overrides)
    recipe_settings(config, IntuitorSettings)  # a bad recipe.* key fails here, before anything starts
    with start_ray(config), Runtime(config) as runtime:
        return fit(runtime, intuitor_step)


if __name__ == "__main__":
    main(sys.argv[1:])
