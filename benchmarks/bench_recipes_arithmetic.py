"""GRPO, DAPO and INTUITOR side by side: held-out accuracy against training time, from one warm start.

All three start from the arithmetic demo's cached warm start (recipes/arithmetic_demo: a 3.2M Qwen2
taught 2-digit addition to partial accuracy by a fixed number of supervised steps), train on the same task
with the same batch (64 prompts x 8 samples), learning rate and ranks, each for the same budget of training
seconds, and are validated (greedy, exact match, 500 held-out problems) at the same points of that budget.
Only what makes each algorithm differs:

- grpo: `trainer.algorithms.rl_step` with the demo's config (clip 0.2, no KL, exact-match reward);
- dapo: `recipes/dapo` `dapo_step` (dynamic sampling, overlong filtering), clip 0.2/0.28, token-mean, the
  soft overlong punishment; its generation rounds per step are reported;
- intuitor: `recipes/intuitor` `intuitor_step`: self-certainty is the only reward (no labels in training),
  k3 KL to the reference with beta 0.005.

Run (from the repository root; about budget x 3 plus start-up):
    RAY_AUTH_MODE=disabled python benchmarks/bench_recipes_arithmetic.py --budget-s 300 --eval-every-s 60
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from recipes.arithmetic_demo import main as DEMO
from recipes.dapo import main as DAPO
from recipes.intuitor import main as INTUITOR
from trainer.algorithms import rl_step
from trainer.fit import Every, Progress, StopAt, fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.validation import validate
from trainer.warm_start import warm_started_model

ALGORITHMS: dict[str, tuple[Callable[[Runtime, Batch], Batch], list[str]]] = {
    "grpo": (rl_step, []),
    "dapo": (
        DAPO.dapo_step,
        [
            "actor.clip_eps_high=0.28",
            "actor.loss_agg_mode=token-mean",
            "recipe.overlong_cache_length=2",
            "recipe.max_rounds=4",
        ],
    ),
    "intuitor": (
        INTUITOR.intuitor_step,
        [
            "actor.use_kl_loss=true",
            "actor.kl_loss_coef=0.005",
            "actor.kl_estimator=k3",
            "actor.loss_agg_mode=seq-mean-token-mean",
        ],
    ),
}


def run(name: str, model_dir: Path, data_dir: Path, args: argparse.Namespace) -> dict:
    step_fn, overrides = ALGORITHMS[name]
    config = DEMO.demo_config(
        data_dir,
        args.seed,
        [
            "trainer.total_steps=100000",
            "trainer.val_every=0",
            "trainer.val_before_train=true",
            "trainer.loggers=[jsonl]",
            f"trainer.output_dir=outputs/bench_recipes/{name}",
            *overrides,
        ],
        model_dir,
    )
    curve: list[dict] = []

    def evaluate(runtime: Runtime, progress: Progress) -> dict[str, float]:
        metrics = validate(runtime)
        accuracy = metrics["val/accuracy"]
        curve.append({"train_s": progress.seconds, "step": progress.steps, "accuracy": accuracy})
        print(f"{name:>9} step {progress.steps:>4} train {progress.seconds:>6.0f} s  accuracy {accuracy:.1%}", flush=True)
        return metrics

    with start_ray(config), Runtime(config) as runtime:
        fit(
            runtime,
            step_fn,
            stop=StopAt(seconds=args.budget_s),
            evaluate=evaluate,
            evaluate_every=Every(seconds=args.eval_every_s),
        )
    result = {"curve": curve}
    rounds = [r["dapo/rounds"] for r in read_jsonl(Path(config.trainer.output_dir) / "metrics.jsonl") if "dapo/rounds" in r]
    if rounds:
        result["rounds_per_step"] = sum(rounds) / len(rounds)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-s", type=float, default=300.0, help="training seconds per algorithm")
    parser.add_argument("--eval-every-s", type=float, default=60.0, help="validate every this many training seconds")
    parser.add_argument("--algos", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/bench_recipes/results.json")
    args = parser.parse_args()
    data_dir = DEMO.ensure_arithmetic_splits(DEMO.CACHE / "data")
    warm = replace(DEMO.WARM_START, seed=args.seed)
    model_dir, warm_accuracy = warm_started_model(DEMO.demo_config(data_dir, args.seed, []), DEMO.CACHE, warm)
    print(f"warm start {model_dir}: {warm_accuracy:.1%} held-out accuracy (HF greedy)")
    results = {name: run(name, model_dir, data_dir, args) for name in args.algos}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\n{'train s':>8} " + " ".join(f"{name:>9}" for name in args.algos))
    points = max(len(r["curve"]) for r in results.values())
    for i in range(points):
        cells = []
        for name in args.algos:
            curve = results[name]["curve"]
            cells.append(f"{curve[i]['accuracy']:>9.1%}" if i < len(curve) else f"{'':>9}")
        budget_point = min(i * args.eval_every_s, args.budget_s)
        print(f"{budget_point:>8.0f} " + " ".join(cells))
    for name in args.algos:
        steps = results[name]["curve"][-1]["step"]
        extra = f", {results[name]['rounds_per_step']:.2f} generation rounds per step" if "rounds_per_step" in results[name] else ""
        print(f"{name}: {steps} steps in the budget{extra}")
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
