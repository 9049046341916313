"""INTUITOR (label-free) against GRPO with labels on SmolLM2-135M-Instruct, equal steps, several seeds.

Both sides run `recipes/intuitor` on the sums of `recipes/smollm2` ("What is 12 + 7?", the 100 held-out
sums scored greedy) with the same overrides: the paper's G = 7, T = 0.9, k3 KL to the reference with
beta = 0.005, a cosine schedule with 10% warm-up, a 256-token cap, 8 prompts a step in one optimizer step,
and ``--lr`` (the paper's 3e-6 or the recipe's 2e-5). They differ only in the advantage:

- **intuitor**: GRPO's group-normalised advantage on self-certainty; the answers never reach training;
- **grpo**: ``recipe.self_certainty_weight=0 recipe.external_reward_weight=1``: GRPO's advantage on the
  exact-match reward (the last number of the response equals the sum); self-certainty is still computed
  in the same forward and logged, so both sides report it.

``data.seed`` and ``rollout.seed`` take the seed: the two sides of a seed see the same prompts in the same
order and the same sampling seeds. From each run's ``metrics.jsonl`` it prints held-out greedy accuracy
before training and every ``--val-every`` steps, the held-out greedy response length, the training
samples' mean length and truncated share and self-certainty over the first and last 5 steps, the prompts,
generated tokens and seconds of training (8 prompts x 7 samples a step); then the mean over seeds of each side.
Each run also keeps the samples it trained on (``trainer.rollout_dump``: ``<run>/rollouts/step_<k>.jsonl``);
from them it prints, over the first and the last 5 steps, the share of samples that state no answer (no
number but the question's operands), the share right, and the mean self-certainty with and without one.

Run:  python benchmarks/bench_intuitor_smollm2.py [--arms intuitor grpo] [--seeds 0 1 2] [--steps 20]
      [--lr 2e-5]   (a complete run is reused; --fresh runs it again; --report runs nothing)
Results: docs/benchmarks.md ("INTUITOR on SmolLM2-135M-Instruct") and recipes/intuitor/README.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from _recipe_runs import REPO, completed_run, seeded_schedule

sys.path.insert(0, str(REPO))

from hybridflow.data.files import read_rows
from hybridflow.metrics.rollout_dump import read_rollout_dump
from recipes.smollm2.main import CACHE, prepare

OUT = Path("outputs/bench_intuitor_smollm2")
ARMS = {
    "intuitor": ["recipe.self_certainty_weight=1", "recipe.external_reward_weight=0"],
    "grpo": ["recipe.self_certainty_weight=0", "recipe.external_reward_weight=1"],
}


def shared_overrides(lr: float, steps: int) -> list[str]:
    """The settings both sides train with (the paper's, at ``lr``; warm-up 10% of ``steps``)."""
    data = CACHE / "data"
    return [
        f"model.path={CACHE / 'model'}",
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'test.parquet'}]",
        "data.max_prompt_length=64",
        "data.max_response_length=256",
        "data.train_batch_size=8",
        "data.val_batch_size=100",
        "rollout.n=7",
        "rollout.temperature=0.9",
        "rollout.kv_cache_bytes=268435456",
        f"actor.lr={lr}",
        "actor.lr_scheduler=cosine",
        f"actor.warmup_steps={max(1, steps // 10)}",
        "actor.ppo_mini_batch_size=56",
        "actor.ppo_micro_batch_size=8",
        "actor.forward_micro_batch_size=8",
        "actor.keep_freed_host_memory=true",
        "ref.forward_micro_batch_size=8",
        "resharding.bucket_bytes=16777216",
        "resource.slots_per_node=1",
        "resource.cpus_per_slot=2",
        "trainer.val_before_train=true",
        "trainer.rollout_dump=true",  # the trained samples' text, to read what a run converged to
    ]


def summary(rows: list[dict]) -> dict[str, object]:
    """One run's figures from its metrics records."""
    steps = [r for r in rows if "timing_s/update" in r]
    first, last = steps[:5], steps[-5:]
    return {
        "accuracy": {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r},
        "val_length": {r["step"]: r["val/response_length_mean"] for r in rows if "val/accuracy" in r},
        "length": [statistics.mean(r["response_length/mean"] for r in part) for part in (first, last)],
        "truncated": [statistics.mean(r["response/truncation_rate"] for r in part) for part in (first, last)],
        "certainty": [statistics.mean(r["intuitor/self_certainty_mean"] for r in part) for part in (first, last)],
        "tokens": sum(r["response/generated_tokens"] for r in steps),
        "train_s": max(r["time/training_s"] for r in steps),
    }


def answer_kinds(folder: Path, steps: range) -> dict[str, float]:
    """From a run's kept samples (``rollouts/step_<k>.jsonl``) over ``steps``: the share that states no
    answer (no number but the question's operands), the share right (the last number is the sum), and
    the mean self-certainty (the dump's ``score``, nats) of samples without and with an answer."""
    questions = read_rows(CACHE / "data" / "train.parquet")
    dump = read_rollout_dump(folder / "rollouts")
    answered: list[bool] = []
    right: list[bool] = []
    certainty: dict[bool, list[float]] = {False: [], True: []}
    for row in (row for step in steps for row in dump[step]):
        question = questions[row["index"]]
        operands = set(re.findall(r"\d+", question["prompt"][0]["content"]))
        numbers = re.findall(r"-?\d+", row["response_text"].replace(",", ""))
        states = any(number.lstrip("-") not in operands for number in numbers)
        answered.append(states)
        right.append(bool(numbers) and numbers[-1] == question["reward_model"]["ground_truth"])
        certainty[states].append(row["score"])
    return {
        "no_answer": 1 - statistics.mean(answered),
        "right": statistics.mean(right),
        "certainty_no_answer": statistics.mean(certainty[False]) if certainty[False] else float("nan"),
        "certainty_answered": statistics.mean(certainty[True]) if certainty[True] else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--fresh", action="store_true", help="run again even where a complete run exists")
    parser.add_argument("--report", action="store_true", help="run nothing: tabulate the complete runs there are")
    args = parser.parse_args()

    if not args.report:
        prepare()
    results = {}
    for seed in args.seeds:
        for arm in args.arms:
            folder = OUT / f"{arm}_lr{args.lr:g}_seed{seed}_steps{args.steps}"
            overrides = [
                *shared_overrides(args.lr, args.steps),
                *seeded_schedule(args.steps, args.val_every, seed),
                *ARMS[arm],
            ]
            rows = completed_run(
                folder, overrides, args.steps, fresh=args.fresh, report=args.report, recipe="recipes/intuitor/main.py"
            )
            if rows is not None:
                results[arm, seed] = summary(rows)

    val_steps = sorted({step for r in results.values() for step in r["accuracy"]})
    header = ["side", "seed", *(f"held-out @{s} (length)" for s in val_steps)]
    header += ["train length (first 5 -> last 5)", "truncated", "self-certainty (nats)", "tokens", "train s"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for (arm, seed), r in results.items():
        cells = [arm, str(seed)]
        cells += [f"{r['accuracy'][s]:.0%} ({r['val_length'][s]:.0f})" for s in val_steps]
        cells += [
            "{:.0f} -> {:.0f}".format(*r["length"]),
            "{:.1%} -> {:.1%}".format(*r["truncated"]),
            "{:.2f} -> {:.2f}".format(*r["certainty"]),
            f"{r['tokens']:,.0f}",
            f"{r['train_s']:.0f}",
        ]
        print("| " + " | ".join(cells) + " |")
    print()
    for arm in args.arms:
        runs = [r for (a, _), r in results.items() if a == arm]
        if runs:
            means = [statistics.mean(r["accuracy"][s] for r in runs) for s in val_steps]
            spread = statistics.pstdev(r["accuracy"][val_steps[-1]] - r["accuracy"][val_steps[0]] for r in runs)
            accuracy = " -> ".join(f"{m:.1%}" for m in means)
            print(f"{arm}: {len(runs)} seeds, held-out mean {accuracy} (std of the change over seeds {spread:.1%})")
    print()
    for arm, seed in results:
        folder = REPO / OUT / f"{arm}_lr{args.lr:g}_seed{seed}_steps{args.steps}"
        if (folder / "rollouts").is_dir():  # runs made before the samples were kept have none
            for steps in (range(1, 6), range(args.steps - 4, args.steps + 1)):
                kinds = answer_kinds(folder, steps)
                print(
                    f"{arm} seed {seed}, steps {steps.start}-{steps.stop - 1}: no answer {kinds['no_answer']:.1%}, "
                    f"right {kinds['right']:.1%}, self-certainty without an answer "
                    f"{kinds['certainty_no_answer']:.2f} against {kinds['certainty_answered']:.2f} with one"
                )


if __name__ == "__main__":
    main()
