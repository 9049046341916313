"""Latent-GRPO against explicit GRPO on 2-digit addition, at equal training wall time.

Both start from the same fresh tiny model (recipes/latent_grpo/config.yaml's ``model.tiny``) after the
same supervised stage (``recipe.sft_*`` steps, rows and learning rate), one in the latent format (2 latent
steps, ``>``, answer) and one in the explicit format (4 chain tokens, ``>``, answer); see
recipes/latent_grpo/README.md. Each then trains with its RL algorithm (``python -m recipes.latent_grpo.main
recipe.variant=...``, 2 colocated ranks, HF engine) until its steps took ``--seconds`` of wall time
(``recipe.time_budget_s``: validation and start-up excluded). Held-out greedy accuracy (500 problems) and
mean response length (latent steps + explicit tokens) are measured before the first step and after the
last. The two runs are sequential, each in its own process.

At an equal supervised budget the explicit format starts far weaker (1.4% against 41.6% after 300 steps:
docs/benchmarks.md). ``--explicit-sft-steps N`` gives the explicit variant its own supervised budget, so
that both start from a similar accuracy (800 steps: 46.2%).

``--steps N`` runs N steps per variant instead of a time budget (equal steps), ``--seeds`` repeats each
variant per RL seed (``rollout.seed`` and ``data.seed``; the supervised start is the same), ``--val-every``
adds held-out readings in between (the curve, and the best reading), ``--variants`` runs one side only
(the ablation runs the latent side per setting), and ``--json`` writes every run's summary, held-out curve and training trace (`trace`).

Run (from the repository root):
    python -m benchmarks.bench_latent_grpo [--seconds 150 | --steps 200] [--explicit-sft-steps 800]
        [--seeds 0 1 2] [--val-every 25] [--variants latent] [--json out.json] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hybridflow.metrics import read_jsonl
from trainer.config import load_config

VARIANTS = ("explicit", "latent")
CONFIG = Path(__file__).resolve().parents[1] / "recipes" / "latent_grpo" / "config.yaml"


def run_variant(
    variant: str, seconds: float, output: Path, overrides: list[str], steps: int = 0, val_every: int = 100000
) -> list[dict]:
    """The metrics records of one run of the recipe: ``steps`` steps, or (``steps`` 0) as many as fit in
    ``seconds`` of training."""
    budget = [f"recipe.time_budget_s={seconds}", "trainer.total_steps=100000"]
    command = [
        sys.executable,
        "-m",
        "recipes.latent_grpo.main",
        f"recipe.variant={variant}",
        *(budget if steps == 0 else ["recipe.time_budget_s=0", f"trainer.total_steps={steps}"]),
        f"trainer.val_every={val_every}",
        "trainer.val_before_train=true",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={output}",
        *overrides,
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    subprocess.run(command, check=True, env=env)
    return read_jsonl(output / "metrics.jsonl")


def summary(records: list[dict], prompts_per_round: int) -> dict[str, float]:
    """One run's totals and held-out readings. ``prompts`` counts every prompt sampled (a step of the
    latent variant samples ``latent/rounds`` rounds under group filtering), ``tokens`` every generated
    response token, ``training_s`` the steps' seconds (validation and start-up excluded)."""
    before = records[0]  # step 0: the validation before the first step
    last = records[-1]
    steps = [r for r in records if "time/training_s" in r]
    readings = [r for r in records if "val/accuracy" in r]
    best = max(readings, key=lambda r: r["val/accuracy"])
    return {
        "steps": float(last["step"]),
        "prompts": sum(r.get("latent/rounds", 1.0) for r in steps) * prompts_per_round,
        "tokens": sum(r["response/generated_tokens"] for r in steps),
        "training_s": last["time/training_s"],
        "accuracy_before": before["val/accuracy"],
        "accuracy_after": last["val/accuracy"],
        "accuracy_best": best["val/accuracy"],
        "best_step": float(best["step"]),
        "length_before": before["val/response_length_mean"],
        "length_after": last["val/response_length_mean"],
        "train_reward_last": last["score/mean"],
        "latent_steps_last": last.get("latent/latent_steps_mean", float("nan")),
        "truncation_last": last["response/truncation_rate"],
        "entropy_last": last["monitor/diag/entropy"],
    }


def curve(records: list[dict]) -> list[tuple[int, float, float]]:
    """``(step, held-out accuracy, held-out response length)`` at every validation."""
    return [(r["step"], r["val/accuracy"], r["val/response_length_mean"]) for r in records if "val/accuracy" in r]


TRACED = (
    "score/mean",
    "reward/score_mean",
    "latent/latent_steps_mean",
    "response/truncation_rate",
    "monitor/diag/entropy",
    "actor/dual_clip_frac",
    "latent/rounds",
)


def trace(records: list[dict], every: int) -> list[dict[str, float]]:
    """The training diagnostics of every ``every``-th step (those in ``TRACED`` the step recorded):
    the kept and the sampled reward, latent steps, truncation, entropy, dual-clip share, rounds."""
    return [
        {"step": r["step"], **{k: r[k] for k in TRACED if k in r}}
        for r in records
        if "time/training_s" in r and r["step"] % every == 0
    ]


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f}+-{statistics.stdev(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=150.0, help="training wall time of each variant")
    parser.add_argument("--steps", type=int, default=0, help="steps per run instead of --seconds (0: --seconds)")
    parser.add_argument(
        "--explicit-sft-steps", type=int, default=None, help="supervised steps of the explicit variant only"
    )
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="RL seeds (rollout.seed, data.seed)")
    parser.add_argument("--val-every", type=int, default=100000, help="steps between held-out readings")
    parser.add_argument("--json", type=Path, default=None, help="write every run's summary and curve here")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {variant: [] for variant in args.variants}
    with tempfile.TemporaryDirectory(prefix="bench-latent-grpo-") as scratch:
        for variant in args.variants:
            own = (
                []
                if variant == "latent" or args.explicit_sft_steps is None
                else [f"recipe.sft_steps={args.explicit_sft_steps}"]
            )
            for seed in args.seeds:
                overrides = [*args.overrides, *own, f"rollout.seed={seed}", f"data.seed={seed}"]
                output = Path(scratch) / f"{variant}-{seed}"
                records = run_variant(variant, args.seconds, output, overrides, args.steps, args.val_every)
                prompts = load_config(CONFIG, overrides).data.train_batch_size  # prompts per round
                run = {"seed": seed, **summary(records, prompts), "curve": curve(records), "trace": trace(records, 25)}
                results[variant].append(run)
                print(json.dumps({"variant": variant, "overrides": args.overrides, **run}), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"overrides": args.overrides, "results": results}, indent=1))
    budget = f"{args.steps} steps" if args.steps else f"{args.seconds:.0f} s of training"
    print(f"\n{budget} per run, seeds {args.seeds} (mean+-std over seeds; validation and start-up excluded)")
    columns = ("steps", "prompts", "tokens", "training_s", "accuracy_before", "accuracy_after", "accuracy_best")
    columns += ("length_before", "length_after")
    print("variant  " + " ".join(f"{c:>16}" for c in columns))
    for variant, runs in results.items():
        print(f"{variant:<9}" + " ".join(f"{mean_std([r[c] for r in runs]):>16}" for c in columns))
    if len(results) == len(VARIANTS):
        explicit = statistics.mean(r["length_after"] for r in results["explicit"])
        latent = statistics.mean(r["length_after"] for r in results["latent"])
        print(f"response length explicit / latent after training: {explicit / latent:.2f}x")


if __name__ == "__main__":
    main()
