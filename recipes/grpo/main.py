"""GRPO, R1-Zero style, with the algorithm written out as the step it is.

`grpo_step` is the whole algorithm, one named step per box of the dataflow (Shao et al. 2024,
arXiv:2402.03300). `Runtime` holds the resources (tokenizer, prompt data, colocated
actor/rollout/reference workers on Ray, the reward manager, loggers) and `fit(runtime, grpo_step)` runs
the step with everything around it: resume, validation, logging, checkpoints and the
rollout-vs-trainer sync check.

Run:  python -m recipes.grpo.main [key=value overrides of config.yaml]
(or python recipes/grpo/main.py ...)
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hybridflow.data.synthetic import arithmetic_rows, write_splits
from hybridflow.protocol import Batch
from trainer.config import RunConfig, load_config
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import advantages, generate, old_log_probs, ref_log_probs, score, update_actor

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/grpo/data")  # config.yaml's data.train_files / val_files point here


def prepare_data() -> None:
    """2-digit addition in the instruct style: "What is 13+71? Think ... <think> </think> ... <answer> </answer>."."""
    if not (DATA / "test.parquet").exists():
        write_splits(arithmetic_rows(7600, 500, digits=2, style="instruct", seed=0), DATA, ("parquet",))


def grpo_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One GRPO step, box by box."""
    rollouts = generate(runtime, prompts)  # G samples per prompt from pi_old (vLLM, inference layout)
    rollouts |= score(runtime, rollouts)  # rule reward (accuracy + format bonus), + weight * reward model
    rollouts |= old_log_probs(runtime, rollouts)  # log pi_old of the sampled tokens (training layout)
    if runtime.config.actor.use_kl_loss:
        rollouts |= ref_log_probs(runtime, rollouts)  # log pi_ref, for the KL term of the loss
    rollouts |= advantages(runtime, rollouts)  # A_i = (r_i - mean_group(r)) / std_group(r), on the controller
    update_actor(runtime, rollouts)  # clipped surrogate + beta * k3 KL to pi_ref (FSDP2, training layout)
    return rollouts


def check_supported(config: RunConfig) -> None:
    """This step has no critic and no KL-in-reward box; those configs belong to the general `rl_step`."""
    unsupported = {"critic": config.critic is not None, "algorithm.use_kl_in_reward": config.algorithm.use_kl_in_reward}
    if any(unsupported.values()):
        keys = ", ".join(key for key, used in unsupported.items() if used)
        raise SystemExit(
            f"recipes/grpo/main.py runs critic-free GRPO without KL in the reward (set: {keys}); "
            "run such configs with `python -m trainer.main --config ...`"
        )


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prepare_data()
    # The reward file by absolute path, so the script runs from any folder; later overrides still win.
    config = load_config(
        HERE / "config.yaml", [f"reward.default_fn={HERE / 'reward.py'}:r1_zero_reward", *overrides]
    )
    check_supported(config)
    with start_ray(config), Runtime(config) as runtime:
        return fit(runtime, grpo_step)


if __name__ == "__main__":
    main(sys.argv[1:])
