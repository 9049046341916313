"""SmolLM2-135M GRPO, LoRA against full fine-tuning: the same recipe, task and steps on each side.

Runs `recipes/smollm2` (sums up to 20, 8 prompts x 8 samples a step, vLLM engine, one rank of two
threads) once per mode and seed, one run at a time, each in its own process and output folder:

- **full**: the recipe as it is (every weight trains, lr 2e-5);
- **lora-merged**: ``actor.lora`` with rank ``--rank``, alpha ``2 * rank`` on all seven projections, lr
  ``--lora-lr`` (LoRA's update of ``B A`` is smaller per step than a full weight's, so it takes a larger
  learning rate; 10x the full run's is the usual choice), full weights with the adapters merged in
  pushed to vLLM (``actor.lora.push=merged``);
- **lora-adapters**: the same, the adapters alone pushed to a vLLM engine that serves them
  (``enable_lora``).

``data.seed`` and ``rollout.seed`` (and ``actor.lora.seed``) take the seed, so the two modes of a seed see
the same prompt order and sampling seeds. From each run's ``metrics.jsonl`` it prints: held-out greedy
accuracy (100 sums) before training and every ``--val-every`` steps, the median generation, update and
step seconds, the gradient and optimizer memory of the update (``memory/actor_grad_optimizer_mb``), the
actor process's peak (``memory/actor_process_peak_mb``, which counts the vLLM engine in the same
process), and the MiB pushed to the engine per step (``resharding/to_inference_streamed_mb``).

Run:  python benchmarks/bench_lora_smollm2.py [--steps 20] [--seeds 0 1] [--modes full lora-merged lora-adapters]
      (a run whose metrics file is complete is reused; --fresh runs it again)
Results: docs/benchmarks.md ("LoRA against full fine-tuning on SmolLM2-135M").
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from _recipe_runs import completed_run, seeded_schedule

OUT = Path("outputs/bench_lora_smollm2")


def mode_overrides(mode: str, seed: int, rank: int, lora_lr: float) -> list[str]:
    if mode == "full":
        return []
    push = mode.removeprefix("lora-")
    lora = [f"actor.lora.rank={rank}", f"actor.lora.alpha={2 * rank}", f"actor.lora.seed={seed}"]
    return [*lora, f"actor.lora.push={push}", f"actor.lr={lora_lr}"]


def summary(rows: list[dict]) -> dict[str, object]:
    """One run's figures from its metrics records."""
    steps = [r for r in rows if "timing_s/update" in r]
    accuracy = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}

    def median(key: str) -> float:
        return statistics.median(r[key] for r in steps)

    return {
        "accuracy": accuracy,
        "generation_s": median("timing_s/generation"),
        "update_s": median("timing_s/update"),
        "step_s": median("timing_s/step"),
        "train_min": max(r["time/training_s"] for r in steps) / 60,
        "grad_optimizer_mb": max(r["memory/actor_grad_optimizer_mb"] for r in steps),
        "process_peak_mb": max(r["memory/actor_process_peak_mb"] for r in steps),
        "pushed_mb": median("resharding/to_inference_streamed_mb"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--modes", nargs="+", choices=("full", "lora-merged", "lora-adapters"), default=["full", "lora-merged"]
    )
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    parser.add_argument("--set", nargs="*", default=[], help="more overrides for every run (key=value)")
    parser.add_argument("--fresh", action="store_true", help="run again even where a complete run exists")
    args = parser.parse_args()

    results = {}
    for seed in args.seeds:
        for mode in args.modes:
            folder = OUT / f"{mode}_seed{seed}_steps{args.steps}"
            overrides = [
                *seeded_schedule(args.steps, args.val_every, seed),
                *mode_overrides(mode, seed, args.rank, args.lora_lr),
                *args.set,
            ]
            results[mode, seed] = summary(completed_run(folder, overrides, args.steps, fresh=args.fresh))

    val_steps = sorted({step for r in results.values() for step in r["accuracy"]})
    header = ["mode", "seed", *(f"acc@{s}" for s in val_steps), "generation s", "update s", "step s", "train min"]
    header += ["grad+opt MiB", "process peak MiB", "pushed MiB/step"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for (mode, seed), r in results.items():
        cells = [mode, str(seed), *(f"{r['accuracy'].get(s, float('nan')):.0%}" for s in val_steps)]
        cells += [f"{r['generation_s']:.1f}", f"{r['update_s']:.1f}", f"{r['step_s']:.1f}", f"{r['train_min']:.1f}"]
        cells += [f"{r['grad_optimizer_mb']:.1f}", f"{r['process_peak_mb']:.0f}", f"{r['pushed_mb']:.2f}"]
        print("| " + " | ".join(cells) + " |")
    for mode in args.modes if val_steps else ():
        finals = [results[mode, seed]["accuracy"][val_steps[-1]] for seed in args.seeds]
        print(f"{mode}: accuracy at step {val_steps[-1]}, mean over seeds {statistics.mean(finals):.1%} ({finals})")


if __name__ == "__main__":
    main()
