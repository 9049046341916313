"""The smollm2 recipe's defaults on skills it was not tuned on: held-out accuracy must not fall.

Runs `recipes/smollm2` on each held-out skill of `recipes/smollm2/skills.py` (and on the recipe's own
sums, ``sums``), once per arm and seed, one run at a time, each in its own process and output folder:

- **seq_mean**: ``actor.loss_agg_mode: seq-mean-token-mean`` (each response's loss divided by its own
  length), no reward shaping: the recipe's default before this comparison;
- **token_mean**: ``actor.loss_agg_mode: token-mean`` (every token of the batch weighs the same), no
  reward shaping: the recipe's default since;
- **token_mean_overlong**: token-mean and DAPO's soft overlong punishment (0 up to 96 tokens, a ramp to
  -1 at the 128-token cap).

Every other key is config.yaml's.

``data.seed`` and ``rollout.seed`` take the seed, so the arms of a seed see the same prompt order and
sampling seeds. From each run's ``metrics.jsonl`` it prints: held-out greedy accuracy (100 problems)
before training and every ``--val-every`` steps, the training samples' accuracy (``reward/raw_score_mean``: the
exact-match mean before the overlong punishment) over the first and last 5 steps, the mean response length and the truncated share at the first and last step,
the largest share of groups with equal rewards, the steps where the ``length_growth`` diagnostic held,
and the generated tokens and training seconds.

Run:  python benchmarks/bench_smollm2_skills.py [--skills difference product two_digit_sum sums]
      [--arms seq_mean token_mean token_mean_overlong] [--seeds 0] [--steps 20]
      (a run whose metrics file is complete is reused; --fresh runs it again; --report runs nothing)
Results: recipes/smollm2/README.md ("Defaults that hold off the tuned task") and docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _recipe_runs import REPO, completed_run, seeded_schedule

sys.path.insert(0, str(REPO))

from recipes.smollm2.skills import SKILLS, prepare_skill, skill_overrides

OUT = Path("outputs/bench_smollm2_skills")
OVERLONG = "reward.shaping=[{name: overlong_penalty, kwargs: {max_response_length: 128, cache_length: 32}}]"
ARMS = {
    "seq_mean": ["actor.loss_agg_mode=seq-mean-token-mean", "reward.shaping=[]"],
    "token_mean": ["actor.loss_agg_mode=token-mean", "reward.shaping=[]"],
    "token_mean_overlong": ["actor.loss_agg_mode=token-mean", OVERLONG],
}
TASKS = (*SKILLS, "sums")


def summary(rows: list[dict]) -> dict[str, object]:
    """One run's figures from its metrics records."""
    steps = [r for r in rows if "timing_s/update" in r]
    accuracy = {r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}
    # With the overlong punishment, reward/score_mean is shaped; reward/raw_score_mean is the exact-match mean.
    sampled = [r.get("reward/raw_score_mean", r["reward/score_mean"]) for r in steps]
    return {
        "accuracy": accuracy,
        "sampled_first": statistics.mean(sampled[:5]),
        "sampled_last": statistics.mean(sampled[-5:]),
        "length_first": steps[0]["response_length/mean"],
        "length_last": steps[-1]["response_length/mean"],
        "truncated_first": steps[0]["response/truncation_rate"],
        "truncated_last": steps[-1]["response/truncation_rate"],
        "equal_groups_max": max(r["monitor/diag/equal_reward_group_frac"] for r in steps),
        "length_growth_steps": [r["step"] for r in steps if r.get("monitor/alarm/length_growth") == 1.0],
        "tokens": sum(r["response/generated_tokens"] for r in steps),
        "train_min": max(r["time/training_s"] for r in steps) / 60,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skills", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--set", nargs="*", default=[], help="more overrides for every run (key=value)")
    parser.add_argument("--fresh", action="store_true", help="run again even where a complete run exists")
    parser.add_argument("--report", action="store_true", help="run nothing: tabulate the complete runs there are")
    args = parser.parse_args()

    results = {}
    for skill in args.skills:
        data = [] if skill == "sums" else skill_overrides(prepare_skill(skill))
        for seed in args.seeds:
            for arm in args.arms:
                folder = OUT / f"{skill}_{arm}_seed{seed}_steps{args.steps}"
                overrides = [*data, *seeded_schedule(args.steps, args.val_every, seed), *ARMS[arm], *args.set]
                rows = completed_run(folder, overrides, args.steps, fresh=args.fresh, report=args.report)
                if rows is not None:
                    results[skill, arm, seed] = summary(rows)

    val_steps = sorted({step for r in results.values() for step in r["accuracy"]})
    header = ["skill", "arm", "seed", *(f"held-out @{s}" for s in val_steps)]
    header += ["sampled right (steps 1-5 -> last 5)", "length (first -> last)", "truncated (first -> last)"]
    header += ["equal-reward groups (max)", "length_growth at steps", "tokens", "train min"]
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for (skill, arm, seed), r in results.items():
        cells = [skill, arm, str(seed), *(f"{r['accuracy'].get(s, float('nan')):.0%}" for s in val_steps)]
        cells += [
            f"{r['sampled_first']:.1%} -> {r['sampled_last']:.1%}",
            f"{r['length_first']:.0f} -> {r['length_last']:.0f}",
            f"{r['truncated_first']:.0%} -> {r['truncated_last']:.0%}",
            f"{r['equal_groups_max']:.0%}",
            ",".join(map(str, r["length_growth_steps"])) or "-",
            f"{r['tokens']:,.0f}",
            f"{r['train_min']:.1f}",
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
