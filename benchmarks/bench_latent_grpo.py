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

Run (from the repository root):
    python -m benchmarks.bench_latent_grpo [--seconds 150] [--explicit-sft-steps 800] [overrides ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hybridflow.metrics import read_jsonl

VARIANTS = ("explicit", "latent")


def run_variant(variant: str, seconds: float, output: Path, overrides: list[str]) -> list[dict]:
    """The metrics records of one budgeted run of the recipe."""
    command = [
        sys.executable,
        "-m",
        "recipes.latent_grpo.main",
        f"recipe.variant={variant}",
        f"recipe.time_budget_s={seconds}",
        "trainer.total_steps=100000",
        "trainer.val_every=100000",
        "trainer.val_before_train=true",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={output}",
        *overrides,
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    subprocess.run(command, check=True, env=env)
    return read_jsonl(output / "metrics.jsonl")


def summary(records: list[dict]) -> dict[str, float]:
    before = records[0]  # step 0: the validation before the first step
    last = records[-1]
    return {
        "steps": float(last["step"]),
        "training_s": last["time/training_s"],
        "accuracy_before": before["val/accuracy"],
        "accuracy_after": last["val/accuracy"],
        "length_before": before["val/response_length_mean"],
        "length_after": last["val/response_length_mean"],
        "train_reward_last": last["score/mean"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=150.0, help="training wall time of each variant")
    parser.add_argument(
        "--explicit-sft-steps", type=int, default=None, help="supervised steps of the explicit variant only"
    )
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-latent-grpo-") as scratch:
        for variant in VARIANTS:
            own = (
                []
                if variant == "latent" or args.explicit_sft_steps is None
                else [f"recipe.sft_steps={args.explicit_sft_steps}"]
            )
            overrides = [*args.overrides, *own]
            results[variant] = summary(run_variant(variant, args.seconds, Path(scratch) / variant, overrides))
    print(f"\nequal training wall time: {args.seconds:.0f} s per variant (validation and start-up excluded)")
    header = f"{'variant':<10}{'steps':>7}{'train s':>9}{'acc before':>12}{'acc after':>11}{'len before':>12}{'len after':>11}"
    print(header)
    for variant, r in results.items():
        print(
            f"{variant:<10}{r['steps']:>7.0f}{r['training_s']:>9.0f}{r['accuracy_before']:>12.3f}"
            f"{r['accuracy_after']:>11.3f}{r['length_before']:>12.2f}{r['length_after']:>11.2f}"
        )
    ratio = results["explicit"]["length_after"] / results["latent"]["length_after"]
    print(f"reasoning length explicit / latent after training: {ratio:.2f}x")


if __name__ == "__main__":
    main()
