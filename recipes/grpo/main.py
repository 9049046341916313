"""GRPO, R1-Zero style, with the algorithm written out as the loop it is.

RLTrainer does the setup (tokenizer, prompt data, colocated actor/rollout/reference workers on Ray,
the reward manager, loggers); the loop below is the whole algorithm, one call per box of the
dataflow. It is `RLTrainer.train_step` specialised to GRPO: no critic, no KL penalty in the reward,
the reference policy used only by the KL term of the loss. The other recipes call `trainer.fit()`.

Run:  python recipes/grpo/main.py [key=value overrides of config.yaml]
"""

from __future__ import annotations

import itertools
import logging
import sys
from pathlib import Path

from hybridflow.algos import compute_advantage
from hybridflow.data.synthetic import arithmetic_rows, write_splits
from hybridflow.metrics import step_metrics
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from trainer.config import RunConfig, load_config
from trainer.ray_runtime import start_ray
from trainer.rl_trainer import RLTrainer
from trainer.steps import add_group_ids, decode_responses

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/grpo/data")  # config.yaml's data.train_files / val_files point here
MODEL_INPUTS = ("input_ids", "attention_mask", "responses", "response_mask")


def prepare_data() -> None:
    """2-digit addition in the instruct style: "What is 13+71? Think ... <think> </think> ... <answer> </answer>."."""
    if not (DATA / "test.parquet").exists():
        write_splits(arithmetic_rows(7600, 500, digits=2, style="instruct", seed=0), DATA, ("parquet",))


def grpo_step(trainer: RLTrainer, prompts: Batch, step: int) -> dict[str, float]:
    """One GRPO step (Shao et al. 2024, arXiv:2402.03300), box by box."""
    config, actor, timer, rollout = trainer.config, trainer.actor, trainer.timer, trainer.config.rollout
    sampling = SamplingParams(
        n=rollout.n,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=config.data.max_response_length,
        seed=rollout.seed + step,
    )
    with timer.step():
        with timer.phase("generation"):  # G samples per prompt from pi_old (vLLM, inference layout)
            rollouts = actor.generate_sequences(prompts, sampling)
        rollout_metrics = rollouts.meta.pop("rollout_metrics")
        rollouts = (
            rollouts | add_group_ids(rollouts, rollout.n) | decode_responses(rollouts, trainer.tokenizer)
        )
        with timer.phase("reward"):  # rule reward (accuracy + format bonus), + weight * reward model if set
            scored, reward_metrics = trainer.score(rollouts)
        rollouts = rollouts | scored
        with timer.phase("log_prob"):  # log pi_old and log pi_ref of the sampled tokens (training layout)
            inputs = rollouts.select(*MODEL_INPUTS)
            rollouts = rollouts | actor.compute_log_prob(inputs)
            if config.actor.use_kl_loss:
                rollouts = rollouts | actor.compute_ref_log_prob(inputs)
        with timer.phase("advantage"):  # A_i = (r_i - mean_group(r)) / std_group(r), on the controller
            advantages, _ = compute_advantage(
                rollouts, config.algorithm.adv_estimator, **config.algorithm.advantage_params()
            )
            rollouts = rollouts | Batch({"advantages": advantages})
        with timer.phase("update"):  # clipped surrogate + beta * k3 KL to pi_ref, FSDP2 (training layout)
            columns = [*MODEL_INPUTS, "old_log_probs", "advantages"]
            if config.actor.use_kl_loss:
                columns.append("ref_log_probs")
            actor_metrics = actor.update_actor(rollouts.select(*columns))[0]
    return {**step_metrics(rollouts), **actor_metrics, **rollout_metrics, **reward_metrics, **timer.metrics()}


def check_supported(config: RunConfig) -> None:
    """This loop has no critic, no KL-in-reward box and no checkpoints; those configs belong to `RLTrainer.fit`."""
    unsupported = {
        "critic": config.critic is not None,
        "algorithm.use_kl_in_reward": config.algorithm.use_kl_in_reward,
        "trainer.save_every": config.trainer.save_every > 0,
        "trainer.resume": config.trainer.resume != "disable",
    }
    if any(unsupported.values()):
        keys = ", ".join(key for key, used in unsupported.items() if used)
        raise SystemExit(
            f"recipes/grpo/main.py runs critic-free GRPO without KL in the reward or checkpoints (set: {keys}); "
            "run such configs with `python -m trainer.main --config ...` (RLTrainer.fit)"
        )


def main(overrides: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prepare_data()
    # The reward file by absolute path, so the script runs from any folder; later overrides still win.
    config = load_config(
        HERE / "config.yaml", [f"reward.default_fn={HERE / 'reward.py'}:r1_zero_reward", *overrides]
    )
    check_supported(config)
    with start_ray(config), RLTrainer(config) as trainer:
        val_every, total = config.trainer.val_every, trainer.total_steps
        prompts_forever = itertools.chain.from_iterable(itertools.repeat(trainer.loader))  # epoch after epoch
        for step, prompts in zip(range(1, total + 1), prompts_forever, strict=False):
            metrics = grpo_step(trainer, prompts, step)
            if val_every and (step % val_every == 0 or step == total):
                metrics |= trainer.validate()  # greedy answers to the held-out prompts
            trainer.logger.log(metrics, step)


if __name__ == "__main__":
    main(sys.argv[1:])
