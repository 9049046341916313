"""Time to a held-out accuracy: hybridflow's GRPO against TRL's GRPOTrainer, from the same checkpoint.

Both sides start from the arithmetic demo's cached warm start (recipes/arithmetic_demo: a 3.2M Qwen2
with a character tokenizer, taught 2-digit addition to partial accuracy by a fixed number of supervised
steps), train on the demo's 7,600 problems with the demo's GRPO settings, and are validated on its 500
held-out problems every ``--eval-every`` steps until the accuracy reaches ``--target``:

- per step 64 prompts x 8 samples at temperature 1, up to 6 new tokens; reward 1 when the last number of
  the response is the sum (``exact_match``); group-normalised advantages (mean and std); one AdamW step
  over the 512 rows (lr 1e-4 constant, no weight decay, grad-norm clip 1.0), clip 0.2, no KL, token-mean
  loss; fp32 (``--precision bf16``: bf16 compute on both sides, as in ``bench_grpo.py``).
- **ours**: the demo's config and `trainer.algorithms.rl_step` (the HF engine's rollouts, FSDP2 update,
  one rank of two threads, or 2 colocated ranks with ``--layout two_ranks``; zero-advantage rows skipped
  as by default), with the lr held constant as on TRL's side (the demo decays it); accuracy from the
  trainer's validation (greedy, through the same engine). ``--ours-override rollout.engine=vllm`` runs
  vLLM rollouts instead.
- **trl**: `trl.GRPOTrainer` in one process on both cores (``use_cpu=True``, HF ``generate``,
  ``per_device_train_batch_size=128``, 4 accumulation steps, ``steps_per_generation=4``, ``loss_type="dapo"``,
  ``scale_rewards="group"``, ``beta=0``), in TRL's own venv (``benchmarks/trl/setup.sh``); accuracy from
  HF greedy decoding of the same prompts (up to 6 new tokens), scored by the same last-number rule.

Training time is the sum of the steps' wall times: start-up and validation are not counted on either side.
Each side runs in its own subprocess, ours first. The two accuracy functions are checked against each
other on the shared checkpoint: both sides report their step-0 accuracy.

Run (from the repository root, in the project venv, after ``bash benchmarks/trl/setup.sh``)::

    RAY_AUTH_MODE=disabled python benchmarks/trl/bench_time_to_accuracy.py [--target 0.8] [--eval-every 10]
        [--max-train-s 1200] [--seed 0] [--sides ours,trl] [--precision fp32] [--layout demo]
        [--out benchmarks/trl/runs/time_to_accuracy]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

# This folder: both venvs import it.
from bench_grpo import HERE, LAYOUTS, REPO, SAMPLES_PER_PROMPT, TRL_PYTHON, exact_match, trl_grpo_config

# The demo's own layout (one rank of two threads), or either of the step benchmark's.
DEMO_LAYOUTS = {"demo": [], **LAYOUTS}

PROMPTS_PER_STEP = 64
ROWS_PER_STEP = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
TRL_MICRO_BATCH_ROWS = 128
MAX_NEW_TOKENS = 6


def prepare_inputs(out: Path, seed: int) -> tuple[Path, Path]:
    """The demo's warm-start checkpoint and the task as TRL reads it (rendered prompt text + answer)."""
    from hybridflow.data.chat import render_prompt
    from hybridflow.data.files import read_rows, write_rows
    from hybridflow.models import load_tokenizer_dir
    from recipes.arithmetic_demo import main as demo
    from trainer.warm_start import warm_started_model

    data_dir = demo.ensure_arithmetic_splits(demo.CACHE / "data")
    model_dir, accuracy = warm_started_model(
        demo.demo_config(data_dir, seed, []), demo.CACHE, replace(demo.WARM_START, seed=seed)
    )
    print(f"warm start {model_dir}: {accuracy:.1%} held-out accuracy (HF greedy, exact text)", flush=True)
    tokenizer = load_tokenizer_dir(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        rows = read_rows(data_dir / f"{split}.parquet")
        write_rows(
            [
                {
                    "prompt": render_prompt(tokenizer, row["prompt"]),
                    "answer": str(row["reward_model"]["ground_truth"]),
                }
                for row in rows
            ],
            out / f"trl_{split}.jsonl",
        )
    return model_dir, data_dir


# --------------------------------------------------------------------------- ours


class TargetReached(Exception):
    """Ends a run after an evaluation that reached the target accuracy."""


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    from hybridflow.metrics import read_jsonl
    from recipes.arithmetic_demo import main as demo
    from trainer.algorithms import rl_step
    from trainer.fit import Progress, StopAt, fit
    from trainer.ray_runtime import start_ray
    from trainer.runtime import Runtime
    from trainer.validation import validate

    run_dir = Path(args.run_dir)
    config = demo.demo_config(
        Path(args.data_dir),
        args.seed,
        [
            "trainer.total_steps=100000",
            f"trainer.val_every={args.eval_every}",
            "trainer.val_before_train=true",
            "trainer.loggers=[jsonl]",
            f"trainer.output_dir={run_dir}",
            *DEMO_LAYOUTS[args.layout],
            "actor.lr_scheduler=constant",  # TRL's side runs at a constant lr; the demo decays it
            # The demo's bound on the rollout-vs-trainer gap (0.01 nats) flags stale weights in fp32; bf16
            # training log-probs differ from the fp32 engine's by more at rare tokens (0.22 nats at step 1,
            # 1.03 at step 50, measured), so the bf16 run goes without the check.
            *(["actor.param_dtype=bfloat16", "resharding.max_log_prob_gap=null"] if args.precision == "bf16" else []),
            *args.ours_overrides,
        ],
        Path(args.model_dir),
    )
    curve: list[dict[str, float]] = []

    def evaluate(runtime: Runtime, progress: Progress) -> dict[str, float]:
        metrics = validate(runtime)
        accuracy = metrics["val/accuracy"]
        curve.append({"step": progress.steps, "train_s": progress.seconds, "accuracy": accuracy})
        print(f"ours step {progress.steps:>4} train {progress.seconds:>7.1f} s  accuracy {accuracy:.1%}", flush=True)
        if accuracy >= args.target:
            raise TargetReached
        return metrics

    # Evaluated every --eval-every steps (trainer.val_every) and at the end of the time budget.
    with contextlib.suppress(TargetReached), start_ray(config), Runtime(config) as runtime:
        fit(runtime, rl_step, stop=StopAt(seconds=args.max_train_s), evaluate=evaluate)
    records = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["step"] > 0]
    step_s = [r["timing_s/step"] for r in records]
    skipped = [r.get("actor/rows_skipped", 0.0) for r in records]
    return {"curve": curve, "step_s": step_s, "rows_skipped": skipped}


# --------------------------------------------------------------------------- TRL


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    out = Path(args.out)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    train = load_dataset("json", data_files=str(out / "trl_train.jsonl"), split="train")
    test = [json.loads(line) for line in (out / "trl_test.jsonl").read_text().splitlines()]

    @torch.no_grad()
    def greedy_accuracy(model: Any) -> float:
        was_training = model.training
        model.eval()
        batch = tokenizer(
            [row["prompt"] for row in test], return_tensors="pt", padding=True, padding_side="left",
            add_special_tokens=False,
        )  # fmt: skip
        generated = model.generate(
            **batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
        model.train(was_training)
        texts = tokenizer.batch_decode(generated[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
        return sum(exact_match(texts, [row["answer"] for row in test])) / len(test)

    curve: list[dict[str, float]] = []
    step_s: list[float] = []

    class Clock(TrainerCallback):
        """Times each optimizer step; validates every ``eval_every`` steps with the clock stopped."""

        def __init__(self) -> None:
            self.last = 0.0

        def _evaluate(self, model: Any, control: Any) -> None:
            accuracy = greedy_accuracy(model)
            curve.append({"step": len(step_s), "train_s": sum(step_s), "accuracy": accuracy})
            print(
                f"trl  step {len(step_s):>4} train {sum(step_s):>7.1f} s  accuracy {accuracy:.1%}", flush=True
            )
            if accuracy >= args.target or sum(step_s) >= args.max_train_s:
                control.should_training_stop = True
            self.last = time.perf_counter()

        def on_train_begin(self, args_, state, control, model=None, **kwargs):
            self._evaluate(model, control)

        def on_step_end(self, args_, state, control, model=None, **kwargs):
            step_s.append(time.perf_counter() - self.last)
            self.last = time.perf_counter()
            if len(step_s) % args.eval_every == 0:
                self._evaluate(model, control)

    config = trl_grpo_config(
        Path(args.run_dir),
        rows_per_step=ROWS_PER_STEP,
        micro_batch_rows=TRL_MICRO_BATCH_ROWS,
        max_new_tokens=MAX_NEW_TOKENS,
        bf16=args.precision == "bf16",
        seed=args.seed,
        max_steps=100000,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[exact_match],
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    return {"curve": curve, "step_s": step_s, "torch_threads": torch.get_num_threads()}


# --------------------------------------------------------------------------- driver


def time_to_target(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """The first reading at or above ``target``: its step and training seconds."""
    return next((point for point in curve if point["accuracy"] >= target), None)


def _launch(side: str, model_dir: Path, data_dir: Path, args: argparse.Namespace) -> dict | None:
    python = sys.executable if side == "ours" else str(TRL_PYTHON)
    run_dir = (
        args.out / f"{side}_{args.precision}"
        if side == "trl"
        else args.out / "_".join(["ours", args.precision, args.layout, *args.ours_overrides])
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    command = [
        python, str(Path(__file__).resolve()), "--side", side, "--model-dir", str(model_dir),
        "--data-dir", str(data_dir), "--run-dir", str(run_dir), "--out", str(args.out),
        "--seed", str(args.seed), "--target", str(args.target), "--eval-every", str(args.eval_every),
        "--max-train-s", str(args.max_train_s), "--precision", args.precision, "--layout", args.layout,
        *(f"--ours-override={override}" for override in args.ours_overrides),
    ]  # fmt: skip
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    print(f"--- {side}: {run_dir}", flush=True)
    with (run_dir / "log.txt").open("w") as log:
        proc = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    result_file = run_dir / "result.json"
    if proc.returncode != 0 or not result_file.exists():
        tail = (run_dir / "log.txt").read_text(errors="replace").splitlines()[-15:]
        print(f"    FAILED (exit {proc.returncode}); log tail:\n      " + "\n      ".join(tail), flush=True)
        return None
    result = json.loads(result_file.read_text())
    for point in result["curve"]:
        print(
            f"    step {point['step']:>4} train {point['train_s']:>7.1f} s  accuracy {point['accuracy']:.1%}"
        )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", type=float, default=0.8, help="held-out accuracy to reach")
    parser.add_argument("--eval-every", type=int, default=10, help="validate every this many steps")
    parser.add_argument("--max-train-s", type=float, default=1200.0, help="training seconds per side at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sides", default="ours,trl")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="compute, both sides")
    parser.add_argument(
        "--layout", default="demo", choices=sorted(DEMO_LAYOUTS), help="our ranks (demo: as the demo)"
    )
    parser.add_argument(
        "--ours-override", dest="ours_overrides", action="append", default=[], help="a key=value for our config"
    )
    parser.add_argument("--out", type=Path, default=HERE / "runs" / "time_to_accuracy")
    # child-process arguments
    parser.add_argument("--side", choices=["ours", "trl"])
    parser.add_argument("--model-dir")
    parser.add_argument("--data-dir")
    parser.add_argument("--run-dir")
    args = parser.parse_args(argv)
    if args.side:
        result = run_ours(args) if args.side == "ours" else run_trl(args)
        Path(args.run_dir, "result.json").write_text(json.dumps(result, indent=1))
        return
    if "trl" in args.sides and not TRL_PYTHON.exists():
        sys.exit(f"{TRL_PYTHON} is missing: run `bash benchmarks/trl/setup.sh` first")
    args.out = args.out.resolve()
    model_dir, data_dir = prepare_inputs(args.out, args.seed)
    results = {side: _launch(side, model_dir, data_dir, args) for side in args.sides.split(",") if side}
    report = args.out / f"report_{'_'.join([args.precision, args.layout, *args.ours_overrides])}.json"
    report.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, **results}, indent=1))
    print(f"\ntarget {args.target:.0%} held-out accuracy (seed {args.seed}):")
    reached: dict[str, float] = {}
    for side, result in results.items():
        if result is None:
            continue
        hit = time_to_target(result["curve"], args.target)
        median = statistics.median(result["step_s"]) if result["step_s"] else float("nan")
        start = result["curve"][0]["accuracy"] if result["curve"] else float("nan")
        where = "not reached" if hit is None else f"step {hit['step']}, {hit['train_s']:.0f} s of training"
        print(
            f"  {side:<5} start {start:.1%}; {where}; median step {median:.2f} s over {len(result['step_s'])} steps"
        )
        if side == "ours" and result["rows_skipped"]:
            print(
                f"        median rows skipped (zero advantage): {statistics.median(result['rows_skipped']):.0f} of {ROWS_PER_STEP}"
            )
        if hit is not None:
            reached[side] = hit["train_s"]
    if len(reached) == 2:
        print(f"  ours / TRL time to target: {reached['ours'] / reached['trl']:.2f}x")
    print(f"report: {report}")


if __name__ == "__main__":
    main()
