"""GRPO discovers a calculator: a tiny character model learns 3-digit x 2-digit multiplication by
calling a tool it was only shown on other problems.

    1. write the two data sets once (`recipes.tool_arithmetic.task`): the tool's format (calls that
       copy the question's expression, on other operators and shapes), and the multiplication task
       (5,000 training and 50 held-out problems);
    2. warm-start the demo's 3.2M-parameter Qwen2 on the format only: two-operand ``+ - // % **`` and
       three-operand expressions are answered through ``<calc>...</calc>``, one-digit sums and products
       directly; never a 3-digit x 2-digit product (`trainer.warm_start`, cached);
    3. train it with GRPO on multiplication episodes (``agent`` section: the ``calculator_arithmetic``
       environment; 16 prompts x 8 episodes a step, reward 1 for the exact product);
    4. before the first step and every ``trainer.val_every`` steps, run one greedy episode per held-out
       problem and log held-out accuracy and the tool-call rate (`recipes.tool_arithmetic.evaluation`).

The baseline is the same command with ``agent.environment_kwargs.calculator=false``: the same warm start,
prompts, samples and steps, with single-turn episodes in which a call is just a wrong answer.

Run:  python -m recipes.tool_arithmetic.main [--seed N] [key=value overrides of config.yaml]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hybridflow.metrics import read_jsonl
from recipes.tool_arithmetic.evaluation import episode_evaluation
from recipes.tool_arithmetic.task import ensure_task_files
from trainer.algorithms import rl_step
from trainer.config import RunConfig, load_config, recipe_field, recipe_settings
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.run_folder import open_run
from trainer.runtime import Runtime
from trainer.warm_start import WarmStartConfig, warm_start_result, warm_started_model

HERE = Path(__file__).resolve().parent
CACHE = Path(".cache/tool_arithmetic")


@dataclass(frozen=True)
class ToolArithmeticSettings:
    """``recipe.*`` keys: the warm start's supervised steps, sequences per step and learning rate."""

    warm_start_steps: int = recipe_field(1000, ge=1)
    warm_start_batch_size: int = recipe_field(32, ge=1)
    warm_start_lr: float = recipe_field(1e-3, gt=0.0)


def recipe_config(
    files: dict[str, Path],
    seed: int,
    overrides: Sequence[str],
    model_dir: Path | None = None,
    warm: bool = False,
) -> RunConfig:
    """config.yaml with the run's seed and ``overrides`` (which win). ``warm``: the warm start's data
    (the tool format); otherwise the multiplication task. ``model_dir`` replaces the tiny model's
    random start."""
    train, test = (files["format_train"], files["format_test"]) if warm else (files["train"], files["test"])
    keys = [
        f"data.train_files=[{train}]",
        f"data.val_files=[{test}]",
        f"model.tiny.seed={seed}",
        f"data.seed={seed}",
        f"rollout.seed={seed}",
    ]
    if model_dir is not None:
        keys.append(f"model.path={model_dir}")
    return load_config(HERE / "config.yaml", [*keys, *overrides])


def warm_start_config(config: RunConfig, seed: int) -> WarmStartConfig:
    """The `WarmStartConfig` of ``config``'s ``recipe`` section, seeded with ``seed``."""
    settings = recipe_settings(config, ToolArithmeticSettings)
    return WarmStartConfig(
        steps=settings.warm_start_steps,
        batch_size=settings.warm_start_batch_size,
        lr=settings.warm_start_lr,
        seed=seed,
        max_steps=settings.warm_start_steps,
    )


def curve_table(records: list[dict]) -> list[str]:
    """One line per evaluation: step, seconds of training, wall seconds since the command started,
    held-out accuracy and tool-call rate."""
    lines = [f"{'step':>5} {'training s':>11} {'wall s':>8} {'accuracy':>9} {'tool calls':>11}"]
    for record in records:
        if "eval/accuracy" in record:
            lines.append(
                f"{record['step']:>5} {record.get('time/training_s', 0.0):>11.0f} {record['eval/wall_s']:>8.0f} "
                f"{record['eval/accuracy']:>9.1%} {record['eval/tool_call_rate']:>11.1%}"
            )
    return lines


def main(argv: Sequence[str]) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.tool_arithmetic.main", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default 0)")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    start = time.monotonic()
    files = ensure_task_files(CACHE / "data")

    warm_config = recipe_config(files, args.seed, overrides, warm=True)
    model_dir, format_accuracy = warm_started_model(
        warm_config, CACHE, warm_start_config(warm_config, args.seed)
    )
    print(
        f"warm start: {warm_start_result(model_dir).steps} supervised steps on the tool's format "
        f"(seed {args.seed}) -> first turn right on {format_accuracy:.1%} of held-out format problems "
        f"(never a product); checkpoint {model_dir} ({time.monotonic() - start:.0f} s so far)"
    )

    config = recipe_config(files, args.seed, overrides, model_dir)
    run = open_run(config)
    with start_ray(config), Runtime(config, run=run) as runtime:
        fit(runtime, rl_step, evaluate=episode_evaluation(start))
    records = read_jsonl(Path(config.trainer.output_dir) / "metrics.jsonl")
    evaluated = [record for record in records if "eval/accuracy" in record]
    print("\n".join(curve_table(records)))
    first, last = evaluated[0], evaluated[-1]
    print(
        f"held-out greedy accuracy {first['eval/accuracy']:.1%} -> {last['eval/accuracy']:.1%}, tool-call rate "
        f"{first['eval/tool_call_rate']:.1%} -> {last['eval/tool_call_rate']:.1%} after {last['step']} steps "
        f"(calculator {'on' if config.agent.environment_kwargs['calculator'] else 'off'}); "
        f"the whole run took {time.monotonic() - start:.0f} s"
    )
    return {key: last[key] for key in ("eval/accuracy", "eval/tool_call_rate")}


if __name__ == "__main__":
    main(sys.argv[1:])
