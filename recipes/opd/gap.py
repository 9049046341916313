"""The distillation gap on 2-digit addition: how much of a GRPO-trained teacher's lead each method closes.

    teacher   the arithmetic demo's model (3.2M parameters), warm-started and trained with the demo's GRPO
              config for ``--teacher-steps`` steps (the demo's 250 by default), exported as a Hugging
              Face folder (`train_teacher`);
    student   recipes/opd's shape (0.8M parameters, the same character tokenizer), given the supervised
              format warm start at its size (`student_start`); every method starts from that checkpoint.

The four methods, at the same student budget of ``--steps`` optimizer steps of ``data.train_batch_size``
prompts x ``rollout.n`` sequences (recipes/opd/config.yaml: 16 x 4) at one learning rate ``--lr``:

    opd        on-policy distillation (`recipes.opd.main.opd_step`);
    sft        supervised steps on the teacher's greedy answers to ``steps x 16`` training prompts, 64
               rows a step (off-policy distillation; `trainer.warm_start.warm_start` on relabelled rows);
    grpo       GRPO with the task reward (`trainer.algorithms.rl_step`);
    opd_grpo   OPD for the first half of the steps, then GRPO, in one run.

Run:  python -m recipes.opd.gap teacher [--teacher-steps N] (once: trains and exports the teacher)
      python -m recipes.opd.gap student                    (the student's start; the runs make it too)
      python -m recipes.opd.gap grid [--steps N] [--lr LR] [--seeds 0 1 2] [--methods ...] [--results DIR]
                                   [--set KEY=VALUE ...]   (config overrides of the RL runs, e.g.
                                                            recipe.baseline=position)
      python -m recipes.opd.gap run --methods opd --seeds 0 (runs in this process, no table)
      python -m recipes.opd.gap table                      (the table of the runs done so far)
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch

from hybridflow.data import read_rows
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.metrics import read_jsonl
from hybridflow.models import load_causal_lm, load_tokenizer_dir
from hybridflow.protocol import Batch
from recipes.arithmetic_demo.main import CACHE, WARM_START, demo_config
from recipes.opd.main import DATA, HERE, opd_step
from recipes.opd.sft_data import relabelled
from trainer.algorithms import rl_step
from trainer.config import RunConfig, load_config
from trainer.fit import GENERATED_METRIC, TRAINING_SECONDS_METRIC, StepFn, fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.warm_start import (
    WarmStartConfig,
    greedy_accuracy,
    greedy_answers,
    warm_start,
    warm_started_model,
)

OUT = Path("outputs/opd_gap")
TEACHER = OUT / "teacher"
STUDENT_CACHE = Path(".cache/recipes/opd")
STUDENT_WARM_START = WarmStartConfig(min_accuracy=0.25, max_steps=3000, extend_every=20)
"""The demo's warm start (290 steps of 128 rows at lr 1e-3), extended in blocks of 20 steps until 25%."""
METHODS = ("opd", "sft", "grpo", "opd_grpo")
ACCURACY = "val/accuracy"
REVERSE_KL = "opd/reverse_kl"
SFT_ROWS = 64  # rows per supervised step: the RL methods' 16 prompts x 4 samples


def train_teacher(steps: int, seed: int = 0) -> dict[str, float]:
    """The arithmetic demo's GRPO run (its config.yaml, seed ``seed``) for ``steps`` steps (its cosine
    schedule over them; held-out accuracy at the start, half-way and the end), the final policy exported to
    ``TEACHER/final/hf``; returns its held-out greedy accuracy before and after and the seconds taken,
    also written to ``TEACHER/teacher.json``."""
    start = time.monotonic()
    data_dir = ensure_arithmetic_splits(CACHE / "data")
    warm = replace(WARM_START, seed=seed)
    model_dir, _ = warm_started_model(demo_config(data_dir, seed, []), CACHE, warm)
    overrides = [
        f"trainer.total_steps={steps}",
        f"trainer.val_every={steps // 2}",
        f"trainer.output_dir={TEACHER / 'run'}",
        "trainer.existing_output=delete",
    ]
    config = demo_config(data_dir, seed, overrides, model_dir)
    with start_ray(config), Runtime(config) as runtime:
        fit(runtime, rl_step)
        runtime.actor.save_checkpoint(str(TEACHER / "final"), export_hf=True)
    validated = [r for r in read_jsonl(TEACHER / "run" / "metrics.jsonl") if ACCURACY in r]
    result = {
        "before": validated[0][ACCURACY],
        "after": validated[-1][ACCURACY],
        "steps": validated[-1]["step"],
        "seconds": time.monotonic() - start,
        "path": str(TEACHER / "final" / "hf"),
    }
    (TEACHER / "teacher.json").write_text(json.dumps(result, indent=1))
    return result


def student_config(overrides: Sequence[str] = ()) -> RunConfig:
    """recipes/opd/config.yaml with its data written and ``overrides``."""
    ensure_arithmetic_splits(DATA)
    return load_config(HERE / "config.yaml", list(overrides))


def student_start() -> tuple[Path, float]:
    """The student's starting checkpoint (recipes/opd's tiny model, seed 0, `STUDENT_WARM_START`, cached
    under .cache/recipes/opd) and its held-out greedy accuracy."""
    return warm_started_model(student_config(), STUDENT_CACHE, STUDENT_WARM_START)


def run_sft(seed: int, steps: int, lr: float, folder: Path) -> dict[str, float]:
    """Off-policy distillation: the teacher's greedy answers to ``steps x data.train_batch_size``
    training prompts (drawn by ``seed``), then ``steps`` supervised steps of `SFT_ROWS` rows drawn from
    them with replacement, from the student's start."""
    config = student_config()
    start_dir, before = student_start()
    tokenizer = load_tokenizer_dir(start_dir)
    train = read_rows(config.data.train_files[0])
    held_out = read_rows(config.data.val_files[0])
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))
    pool = [train[i] for i in order[: steps * config.data.train_batch_size].tolist()]
    teacher_started = time.monotonic()
    teacher = load_causal_lm(TEACHER / "final" / "hf")
    answers = greedy_answers(teacher, tokenizer, pool, config.data.max_response_length)
    teacher_seconds = time.monotonic() - teacher_started
    teacher_tokens = sum(len(tokenizer.encode(a, add_special_tokens=False)) + 1 for a in answers)  # + eos
    rows = relabelled(pool, answers)
    settings = WarmStartConfig(steps=steps, batch_size=SFT_ROWS, lr=lr, seed=seed)
    result = warm_start(start_dir, tokenizer, rows, held_out, folder / "model", settings)
    # warm_start's seconds include its one held-out measurement at the end: time one more, for the table's note.
    measured = time.monotonic()
    greedy_accuracy(load_causal_lm(folder / "model"), tokenizer, held_out)
    measure_seconds = time.monotonic() - measured
    return {
        "before": before,
        "after": result.accuracy,
        "steps": steps,
        "prompts": len(pool),
        "student_generated_tokens": 0,
        "student_seconds": result.seconds,
        "held_out_measure_seconds": measure_seconds,
        "teacher_generated_tokens": teacher_tokens,
        "teacher_seconds": teacher_seconds,
        "teacher_label_accuracy": statistics.fmean(
            a == str(r["reward_model"]["ground_truth"]) for a, r in zip(answers, pool, strict=True)
        ),
    }


def switching_step(switch_after: int) -> StepFn:
    """OPD for steps 1..``switch_after``, GRPO (`rl_step`) after."""

    def step(runtime: Runtime, prompts: Batch) -> Batch:
        return opd_step(runtime, prompts) if runtime.step <= switch_after else rl_step(runtime, prompts)

    return step


def run_rl(
    method: str, seed: int, steps: int, lr: float, folder: Path, extra: Sequence[str] = ()
) -> dict[str, float]:
    """One Ray run of ``method`` (opd, grpo, opd_grpo) from the student's start, with the config
    overrides ``extra`` last; its numbers from the run's metrics.jsonl."""
    start_dir, _ = student_start()
    overrides = [
        f"model.path={start_dir}",
        f"data.seed={seed}",
        f"rollout.seed={seed}",
        "rollout.engine=hf",
        f"actor.lr={lr}",
        f"trainer.total_steps={steps}",
        f"trainer.val_every={steps // 2}",
        "trainer.val_before_train=true",
        f"trainer.output_dir={folder}",
        "trainer.existing_output=delete",
        "trainer.loggers=[jsonl]",
    ]
    if method != "grpo":
        overrides.append(f"teacher.path={TEACHER / 'final' / 'hf'}")
    overrides.extend(extra)
    config = student_config(overrides)
    step = {"opd": opd_step, "grpo": rl_step, "opd_grpo": switching_step(steps // 2)}[method]
    with start_ray(config), Runtime(config) as runtime:
        fit(runtime, step)
    records = read_jsonl(folder / "metrics.jsonl")
    validated = [r for r in records if ACCURACY in r]
    trained = [r for r in records if GENERATED_METRIC in r]
    teacher_seconds = sum(r.get("timing_s/teacher", 0.0) for r in trained)
    # The OPD steps' sampled reverse KL (nats per token), mean of the first and of the last 5 of them.
    kl = [r[REVERSE_KL] for r in trained if REVERSE_KL in r]
    kl_ends = {"reverse_kl_first5": statistics.fmean(kl[:5]), "reverse_kl_last5": statistics.fmean(kl[-5:])} if kl else {}
    return {
        **kl_ends,
        "before": validated[0][ACCURACY],
        "middle": validated[1][ACCURACY] if len(validated) > 2 else float("nan"),
        "after": validated[-1][ACCURACY],
        "steps": trained[-1]["step"],
        "prompts": trained[-1]["step"] * config.data.train_batch_size,
        "student_generated_tokens": sum(r[GENERATED_METRIC] for r in trained),
        "student_seconds": trained[-1][TRAINING_SECONDS_METRIC] - teacher_seconds,
        "teacher_generated_tokens": 0,
        "teacher_seconds": teacher_seconds,
    }


def run_one(
    method: str, seed: int, steps: int, lr: float, results: Path = OUT, extra: Sequence[str] = ()
) -> dict[str, float]:
    """Run ``method`` with ``seed`` (an RL method with the config overrides ``extra``, which SFT does not
    take); write its numbers to ``results/<method>/seed<seed>/result.json``."""
    if extra and method == "sft":
        raise ValueError(f"sft takes no config overrides (--set {' '.join(extra)}): it runs no RL config")
    folder = results / method / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    if method == "sft":
        result = run_sft(seed, steps, lr, folder)
    else:
        result = run_rl(method, seed, steps, lr, folder, extra)
    record = {"method": method, "seed": seed, "lr": lr, "overrides": list(extra), **result}
    (folder / "result.json").write_text(json.dumps(record, indent=1))
    return result


def table(results: Path = OUT) -> list[str]:
    """The markdown table of every finished run under ``results``: one row per method and seed, then the
    mean of each method, with the gap to the teacher and the share of it closed."""
    teacher = json.loads((TEACHER / "teacher.json").read_text())["after"]
    lines = [
        f"teacher: {teacher:.1%} held-out greedy accuracy",
        "",
        "| method | seed | steps | prompts | student gen. tokens | student s | teacher gen. tokens | teacher s "
        "| before | half-way | after | gap after (points) | gap closed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method in METHODS:
        runs = [json.loads(p.read_text()) for p in sorted((results / method).glob("seed*/result.json"))]
        for r in runs:
            lines.append(_row(method, str(r["seed"]), r, teacher))
        if len(runs) > 1:
            mean = {key: statistics.fmean(r.get(key, math.nan) for r in runs) for key in _NUMBERS}
            spread = statistics.stdev(r["after"] for r in runs)
            lines.append(_row(f"**{method}**", f"mean of {len(runs)}", mean, teacher, spread))
    return lines


_NUMBERS = (
    "steps", "prompts", "student_generated_tokens", "student_seconds", "teacher_generated_tokens",
    "teacher_seconds", "before", "middle", "after",
)


def _row(method: str, seed: str, r: dict, teacher: float, spread: float | None = None) -> str:
    after = f"{r['after']:.1%}" + ("" if spread is None else f" ± {spread:.1%}")
    closed = (r["after"] - r["before"]) / (teacher - r["before"])
    middle = r.get("middle", math.nan)  # SFT validates only at the end
    half_way = "-" if math.isnan(middle) else f"{middle:.1%}"
    return (
        f"| {method} | {seed} | {r['steps']:.0f} | {r['prompts']:.0f} | {r['student_generated_tokens']:,.0f} "
        f"| {r['student_seconds']:.0f} | {r['teacher_generated_tokens']:,.0f} | {r['teacher_seconds']:.0f} "
        f"| {r['before']:.1%} | {half_way} | {after} | {100 * (teacher - r['after']):.1f} | {closed:.0%} |"
    )


def main(argv: Sequence[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="recipes/opd/gap.py", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["teacher", "student", "run", "grid", "table"])
    parser.add_argument("--steps", type=int, default=60, help="student optimizer steps per method (default 60)")
    parser.add_argument("--teacher-steps", type=int, default=250, help="the teacher's GRPO steps (default 250, the demo's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate of every method (default 1e-4)")
    parser.add_argument("--results", type=Path, default=OUT, help=f"folder of the runs' results (default {OUT})")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides of the RL runs (opd, grpo, opd_grpo), e.g. recipe.baseline=position")
    args = parser.parse_args(argv)
    if args.command == "teacher":
        print(json.dumps(train_teacher(args.teacher_steps), indent=1))
    elif args.command == "student":
        folder, accuracy = student_start()
        print(f"student start: {folder} ({accuracy:.1%} held-out greedy accuracy)")
    elif args.command == "run":
        for method in args.methods:
            for seed in args.seeds:
                print(json.dumps(run_one(method, seed, args.steps, args.lr, args.results, args.set), indent=1))
    elif args.command == "grid":
        # Seed-major, each run in its own process: a finished seed of every method comes before the next
        # seed, and one run's failure leaves the others' results.
        for seed in args.seeds:
            for method in args.methods:
                command = [sys.executable, "-m", "recipes.opd.gap", "run", "--methods", method, "--seeds",
                           str(seed), "--steps", str(args.steps), "--lr", str(args.lr), "--results", str(args.results)]
                if args.set and method != "sft":
                    command += ["--set", *args.set]
                code = subprocess.run(command, check=False).returncode
                if code:
                    print(f"{method} seed {seed} failed (exit {code})", file=sys.stderr)
        print("\n".join(table(args.results)))
    else:
        print("\n".join(table(args.results)))


if __name__ == "__main__":
    main(sys.argv[1:])
