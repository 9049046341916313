"""Re² against DAPO on SmolLM2-135M-Instruct at an equal budget of generated tokens, several seeds.

The task: the sums of `recipes/smollm2` ("What is 12 + 7?", exact match on the last number), every prompt
(training and held-out) with the paper's instruction as a system message (`recipes/re2/re2_task.py`: the
model may give up by saying "It's better to redo the question." and is asked again). Both sides train
SmolLM2 from its released weights with the same sampling (T = 1, responses up to 96 tokens), optimizer
(lr 2e-5, 64 rows a batch in 4 optimizer steps of 16, so both compute old log-probs) and loss (clip
0.2/0.28, dual clip 10, token-mean, no KL), dynamic sampling (up to 4 rounds) and the same rules (the
response ends after the phrase; a redo is no answer):

- re2: `recipes/re2` ``re2_step``: 4 queries x 4 prefixes x 4 continuations, the redo reward (R = 5);
- dapo: `benchmarks/bench_re2.py`'s DAPO step: 8 prompts x 8 samples, a redo scores 0.

Each runs until it has generated ``--budget-tokens`` response tokens (every token the engine produced,
Re²'s first-stage samples included), and is evaluated at the start and every ``--eval-every-tokens``: the
100 held-out sums greedy, then `recipes.re2.main.redo_validation`: 4 sampled answers per problem at the
paper's T = 0.6, accuracy of the first attempt (a redo counts as wrong) and after up to 4 test-time
restarts (a redo is asked again), and the redo rate. Re²'s training samples also give, per step, the redo
rate of continuations after a right prefix and after a wrong one (`re2_redo.redo_after_prefixes`):
whether redo became selective.

Run (from the repository root):
    RAY_AUTH_MODE=disabled python benchmarks/bench_re2_smollm2.py [--algos re2 dapo] [--seeds 0 1 2]
        [--budget-tokens 50000] [--eval-every-tokens 25000]   (--report tabulates the saved runs)
Results: docs/benchmarks.md ("Re² against DAPO on SmolLM2-135M-Instruct") and recipes/re2/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path

from bench_re2 import curve_to_budget, dapo_step

from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from recipes.dapo import main as DAPO
from recipes.re2 import main as RE2
from recipes.re2.re2_redo import REDO_PHRASE
from recipes.re2.re2_task import instructed_copy
from recipes.smollm2.main import CACHE, prepare
from trainer.config import load_config
from trainer.runtime import Runtime
from trainer.validation import validate

REPO = Path(__file__).resolve().parents[1]
OUT = Path("outputs/bench_re2_smollm2")
INSTRUCTED = Path(".cache/recipes/re2/data")  # where the instructed copies of the sums are written
SHARED = [
    "trainer.total_steps=100000",
    "trainer.val_every=0",
    "trainer.val_before_train=true",
    "trainer.loggers=[jsonl]",
    f"model.path={CACHE / 'model'}",
    "model.dtype=float32",
    "data.max_prompt_length=140",
    "data.max_response_length=96",
    "data.val_batch_size=100",
    "rollout.temperature=1.0",
    "rollout.kv_cache_bytes=268435456",
    "actor.lr=2e-5",
    "actor.ppo_mini_batch_size=16",
    "actor.ppo_micro_batch_size=8",
    "actor.forward_micro_batch_size=8",
    "actor.clip_eps_low=0.2",
    "actor.clip_eps_high=0.28",
    "actor.dual_clip_c=10.0",
    "actor.loss_agg_mode=token-mean",
    "actor.use_kl_loss=false",
    "actor.keep_freed_host_memory=true",
    "resharding.bucket_bytes=16777216",
    "resource.slots_per_node=1",
    "resource.cpus_per_slot=2",
]
ALGORITHMS: dict[str, tuple[Path, Callable[[Runtime, Batch], Batch], list[str]]] = {
    "re2": (
        RE2.HERE / "config.yaml",
        RE2.re2_step,
        ["data.train_batch_size=4", "rollout.n=4", "recipe.continuations=4"],
    ),
    "dapo": (
        DAPO.HERE / "config.yaml",
        dapo_step,
        ["data.train_batch_size=8", "rollout.n=8", "reward.shaping=[]", "recipe.max_rounds=4"],
    ),
}
TRAINING_KEYS = (
    "re2/continuation/redo_rate",
    "re2/continuation/redo_after_right_prefix",
    "re2/continuation/redo_after_wrong_prefix",
    "re2/redo_rate",
)


def run(name: str, seed: int, args: argparse.Namespace) -> dict:
    """One side at one seed: its evaluation curve and its per-step training metrics."""
    config_path, step_fn, overrides = ALGORITHMS[name]
    files = [instructed_copy(CACHE / "data" / f"{split}.parquet", REDO_PHRASE, INSTRUCTED) for split in ("train", "test")]
    folder = OUT / f"{name}_seed{seed}"
    config = load_config(
        config_path,
        [
            *SHARED,
            *overrides,
            f"data.train_files=[{files[0]}]",
            f"data.val_files=[{files[1]}]",
            f"data.seed={seed}",
            f"rollout.seed={seed}",
            f"trainer.output_dir={folder}",
        ],
    )

    def measure(runtime: Runtime) -> dict[str, float]:
        restarts = RE2.redo_validation(runtime, RE2.Re2Settings(), samples=4)
        return {
            "greedy": validate(runtime)["val/accuracy"],
            **{key.removeprefix("val_re2/"): value for key, value in restarts.items()},
        }

    curve = curve_to_budget(
        config, step_fn, measure, args.budget_tokens, args.eval_every_tokens, f"{name} seed {seed}"
    )
    steps = [r for r in read_jsonl(REPO / folder / "metrics.jsonl") if "timing_s/update" in r]
    training = [{key: r[key] for key in TRAINING_KEYS if key in r} for r in steps]
    return {"curve": curve, "training": training}


def nan_mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.mean(kept) if kept else math.nan


def report(results: dict[str, dict]) -> None:
    """The table of docs/benchmarks.md: per side and seed, the first and last evaluation."""
    print("| side | seed | steps | tokens | train s | greedy | first attempt (T 0.6) | with restarts | redo rate |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, result in sorted(results.items()):
        first, last = result["curve"][0], result["curve"][-1]
        cells = [
            *key.rsplit("_seed", 1),
            str(last["step"]),
            f"{last['tokens']:,.0f}",
            f"{last['train_s']:.0f}",
            *(
                f"{first[m]:.1%} -> {last[m]:.1%}"
                for m in ("greedy", "accuracy_first_attempt", "accuracy_restarts", "redo_rate")
            ),
        ]
        print("| " + " | ".join(cells) + " |")
    for key, result in sorted(results.items()):
        if key.startswith("re2"):
            rows = result["training"]
            print(
                f"{key}: training redo rate by step (continuations) "
                + ", ".join(f"{r['re2/continuation/redo_rate']:.1%}" for r in rows)
                + "; after a right / wrong prefix, mean over steps "
                + f"{nan_mean([r['re2/continuation/redo_after_right_prefix'] for r in rows]):.2%} / "
                + f"{nan_mean([r['re2/continuation/redo_after_wrong_prefix'] for r in rows]):.2%}"
            )
    for side in ALGORITHMS:
        runs = [r["curve"] for k, r in results.items() if k.startswith(side)]
        if runs:
            for metric in ("greedy", "accuracy_first_attempt", "accuracy_restarts"):
                before = statistics.mean(c[0][metric] for c in runs)
                after = statistics.mean(c[-1][metric] for c in runs)
                print(f"{side}: {len(runs)} seeds, {metric} {before:.1%} -> {after:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-tokens", type=float, default=50000, help="generated tokens per run")
    parser.add_argument("--eval-every-tokens", type=float, default=25000)
    parser.add_argument("--algos", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--report", action="store_true", help="run nothing: tabulate the saved runs")
    args = parser.parse_args()
    results = {}
    if not args.report:
        prepare()
    for seed in args.seeds:
        for name in args.algos:
            path = REPO / OUT / f"{name}_seed{seed}.json"
            if not args.report and not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(run(name, seed, args), indent=1))
            if path.exists():
                results[f"{name}_seed{seed}"] = json.loads(path.read_text())
    report(results)


if __name__ == "__main__":
    main()
