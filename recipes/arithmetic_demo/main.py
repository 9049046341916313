"""The main demo: GRPO visibly teaches a tiny model 2-digit addition, on 2 CPU cores.

    1. write the synthetic task once (7,600 training and 500 held-out problems, "47+38=" -> "85");
    2. build a 3.2M-parameter Qwen2 and warm-start it with a fixed number of supervised steps from a
       fixed seed, to partial held-out accuracy (cached: later runs skip this);
    3. train it with GRPO (64 prompts x 8 samples per step, exact-match reward, HF-engine rollouts,
       FSDP2 updates), measuring held-out greedy accuracy with the configured validation before the first
       step and every ``trainer.val_every`` steps;
    4. print and plot accuracy against steps and against training time.

Run:  python -m recipes.arithmetic_demo.main [--seed N] [key=value overrides of config.yaml]
(or python recipes/arithmetic_demo/main.py ...)

``--seed N`` (default 0) seeds the whole run: the tiny model's weights, the warm-start's batch order,
the prompt order and the rollout sampling.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.metrics import read_jsonl
from hybridflow.metrics.plot import plot_run, x_values
from hybridflow.metrics.startup import process_age_s
from hybridflow.protocol import Batch
from trainer.algorithms import rl_step
from trainer.config import RunConfig, load_config
from trainer.fit import StepFn, fit
from trainer.ray_runtime import start_ray
from trainer.run_folder import open_run
from trainer.runtime import Runtime
from trainer.warm_start import WarmStartConfig, warm_start_result, warm_started_model

HERE = Path(__file__).resolve().parent
CACHE = Path(".cache/arithmetic_demo")
WARM_START = WarmStartConfig(min_accuracy=0.25)
"""290 steps, then blocks of 10 until 25% held-out accuracy (docs/benchmarks.md, "The demo's warm start")."""
ACCURACY = "val/accuracy"
SINCE_START = "time/since_start_s"


def demo_config(data_dir: Path, seed: int, overrides: Sequence[str], model_dir: Path | None = None) -> RunConfig:
    """config.yaml with the task's files, the run's seed and ``overrides`` (which win); ``model_dir``
    replaces the tiny model's random start."""
    keys = [
        f"data.train_files=[{data_dir / 'train.parquet'}]",
        f"data.val_files=[{data_dir / 'test.parquet'}]",
        f"model.tiny.seed={seed}",
        f"data.seed={seed}",
        f"rollout.seed={seed}",
    ]
    if model_dir is not None:
        keys.append(f"model.path={model_dir}")
    return load_config(HERE / "config.yaml", [*keys, *overrides])


def clocked(step_fn: StepFn, start: float) -> StepFn:
    """``step_fn`` that also records ``time/since_start_s``: seconds from ``start`` to the step's end."""

    def step(runtime: Runtime, prompts: Batch) -> Batch:
        rollouts = step_fn(runtime, prompts)
        runtime.record({SINCE_START: time.monotonic() - start})
        return rollouts

    return step


def accuracy_table(records: list[dict], fit_started: float) -> list[str]:
    """One line per validation: step, training time (the running sum of step times) and wall time since
    the command started (for step 0, when training began), and held-out accuracy."""
    lines = [f"{'step':>5} {'training s':>11} {'wall s':>8}  held-out accuracy"]
    for record, train_seconds in zip(records, x_values(records, "time"), strict=True):
        if ACCURACY in record:
            wall = record.get(SINCE_START, fit_started)
            lines.append(f"{record['step']:>5} {train_seconds:>11.0f} {wall:>8.0f}  {record[ACCURACY]:.1%}")
    return lines


def main(argv: Sequence[str]) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="recipes/arithmetic_demo/main.py", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default 0)")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    imports_s = process_age_s()
    start = time.monotonic()
    data_dir = ensure_arithmetic_splits(CACHE / "data")

    warm = replace(WARM_START, seed=args.seed)
    model_dir, warm_accuracy = warm_started_model(demo_config(data_dir, args.seed, overrides), CACHE, warm)
    print(
        f"warm-start: {warm_start_result(model_dir).steps} supervised steps (seed {args.seed}) -> "
        f"{warm_accuracy:.1%} held-out "
        f"accuracy; checkpoint {model_dir} ({time.monotonic() - start:.0f} s so far)"
    )

    config = demo_config(data_dir, args.seed, overrides, model_dir)
    run = open_run(config)  # the output folder is settled before Ray starts (trainer.existing_output)
    # The parts before the runtime open its start-up report (docs/benchmarks.md, "Start-up").
    before = {} if imports_s is None else {"imports": imports_s}
    before["setup"] = time.monotonic() - start
    with (
        start_ray(config) as ray_start,
        Runtime(config, startup_s={**before, "ray": ray_start.seconds}, run=run) as runtime,
    ):
        fit_started = time.monotonic() - start
        fit(runtime, clocked(rl_step, start))
    output = Path(config.trainer.output_dir)
    records = read_jsonl(output / "metrics.jsonl")
    plots = [
        *plot_run(output / "metrics.jsonl", output / "plots", keys=[ACCURACY, "score/mean"]),
        *plot_run(output / "metrics.jsonl", output / "plots", keys=[ACCURACY], x="time"),
    ]
    validated = [record for record in records if ACCURACY in record]
    before, after = validated[0][ACCURACY], validated[-1][ACCURACY]
    print("\n".join(accuracy_table(records, fit_started)))
    print(
        f"held-out greedy accuracy: {before:.1%} before GRPO -> {after:.1%} after "
        f"{validated[-1]['step']} steps; the whole run took {time.monotonic() - start:.0f} s"
    )
    print(f"metrics: {output / 'metrics.jsonl'}; plots: {', '.join(str(p) for p in plots)}")
    return {"before": before, "after": after}


if __name__ == "__main__":
    main(sys.argv[1:])
