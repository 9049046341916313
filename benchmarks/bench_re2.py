"""Re² against DAPO at an equal budget of generated tokens, from one warm start with a rare redo habit.

The task (recipes/re2/re2_task.py): 2-digit addition written from the leading digit, exact match, so a
wrong digit once written can only be repaired by starting again. The start: the arithmetic demo's cached
warm start, then a short supervised phase in which 15% of the answers are a random digit followed by
"It's better to redo the question." (a blind habit: as likely after a right digit as after a wrong one).

Both algorithms then train with the same model, data, sampling (temperature 1, responses up to 40 tokens),
optimizer (lr 3e-5, 8 optimizer steps of 32 rows per 256-row batch, so both compute old log-probs) and loss
(clip 0.2/0.28, dual clip 10, token-mean, no KL), with dynamic sampling (up to 4 rounds):

- re2: `recipes/re2` `re2_step`, 4 queries x 8 prefixes x 8 continuations, the redo reward (R = 5);
- dapo: 32 prompts x 8 samples, exact match (a redo scores 0), the DAPO groups.

Each runs until it has generated ``--budget-tokens`` response tokens (every token the engine produced,
first-stage samples and continuations included), and is evaluated every ``--eval-every-tokens``:
``--samples`` sampled answers (temperature 1) per held-out problem, cut after the redo phrase, give the
redo rate and the accuracy over non-redo samples (the test-time accuracy when every redo is asked again,
at 1 / (1 - redo rate) attempts per question).

Run (from the repository root; about 5 minutes per algorithm on a 2-core host, more under load):
    RAY_AUTH_MODE=disabled python benchmarks/bench_re2.py --budget-tokens 40000 --eval-every-tokens 10000
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from hybridflow.algos.masked import last_valid_token_mask
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from recipes.arithmetic_demo import main as DEMO
from recipes.dapo import main as DAPO
from recipes.re2 import main as RE2
from recipes.re2 import re2_task as TASK
from trainer.config import RunConfig, load_config, recipe_settings
from trainer.fit import Every, Progress, StopAt, fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import advantages, generate, old_log_probs, update_actor
from trainer.validation import validation_rollouts
from trainer.warm_start import warm_started_model

REPO = Path(__file__).resolve().parents[1]
REDO = RE2.Re2Settings()  # the redo phrase and what counts as an answer after it, for both algorithms
SHARED = [
    "trainer.total_steps=100000",
    "trainer.val_every=0",
    "trainer.val_before_train=true",
    "trainer.loggers=[jsonl]",
    "data.max_prompt_length=40",
    "data.max_response_length=40",
    "data.val_batch_size=250",
    "rollout.n=8",
    "rollout.temperature=1.0",
    "actor.lr=3e-5",
    "actor.ppo_mini_batch_size=32",
    "actor.ppo_micro_batch_size=16",
    "actor.forward_micro_batch_size=128",
    "actor.clip_eps_low=0.2",
    "actor.clip_eps_high=0.28",
    "actor.dual_clip_c=10.0",
    "actor.loss_agg_mode=token-mean",
    "actor.use_kl_loss=false",
]


def dapo_step(runtime: Runtime, prompts: Batch) -> Batch:
    """recipes/dapo's step with old log-probs before the update (8 optimizer steps per batch, as re2)."""
    settings = recipe_settings(runtime.config, DAPO.DapoSettings)
    redo = RE2.as_written(runtime.tokenizer, REDO)

    def sample_round(round_index: int) -> Batch:
        rollouts = generate(runtime, prompts if round_index == 0 else runtime.next_prompts())
        # The same rules as re2's: the phrase ends the response, and a redo is no answer (it scores 0).
        rollouts = RE2.ended_at_redo(runtime, rollouts, redo.redo_phrase)
        correct, _ = RE2.judged(runtime, rollouts, redo)
        last = last_valid_token_mask(rollouts["response_mask"].bool())
        return rollouts | Batch(
            {
                "accuracy": correct.float(),
                "scores": correct.float(),
                "token_level_scores": last.float() * correct[:, None],
            }
        )

    rollouts, metrics = DAPO.fill_batch(
        sample_round,
        len(prompts),
        runtime.config.rollout.n,
        settings.max_rounds,
        runtime.tokenizer.pad_token_id,
    )
    runtime.record(metrics)
    if rollouts is None:
        return prompts
    rollouts = RE2.with_trainer_log_prob_at_appended_eos(rollouts | old_log_probs(runtime, rollouts))
    rollouts |= advantages(runtime, rollouts)
    update_actor(runtime, DAPO.without_truncated_tokens(rollouts))
    return rollouts


ALGORITHMS: dict[str, tuple[Path, Callable[[Runtime, Batch], Batch], list[str]]] = {
    "re2": (RE2.HERE / "config.yaml", RE2.re2_step, ["data.train_batch_size=4"]),
    "dapo": (
        DAPO.HERE / "config.yaml",
        dapo_step,
        [
            "data.train_batch_size=32",
            "reward.shaping=[]",
            "recipe.max_rounds=4",
            "recipe.filter_truncated=true",
        ],
    ),
}


def held_out(runtime: Runtime, samples: int) -> dict[str, float]:
    """``samples`` sampled answers per held-out problem (the validation loop, `validation_rollouts`), cut
    after the redo phrase: redo rate, accuracy over non-redo samples, expected rounds, and how often a
    sample redoes after a wrong and after a right first digit (the digit before the phrase: a redo is
    worth something only after a wrong one)."""
    redo_settings = RE2.as_written(runtime.tokenizer, REDO)
    sampling = SamplingParams(
        n=samples, temperature=1.0, max_new_tokens=runtime.config.data.max_response_length, seed=0
    )

    def cut(runtime: Runtime, rollouts: Batch) -> Batch:
        return RE2.ended_at_redo(runtime, rollouts, redo_settings.redo_phrase)

    correct, redo, wrong_start = [], [], []
    for rollouts in validation_rollouts(runtime, sampling, finish=cut):
        flags = torch.tensor(
            [RE2.is_redo(t, redo_settings.redo_phrase, redo_settings.answer_pattern) for t in rollouts["response_text"]]
        )
        correct.append((rollouts["scores"] >= 1.0) & ~flags)
        redo.append(flags)
        truths = [str(t) for t in rollouts["ground_truth"]]
        wrong_start.append(
            torch.tensor([t[:1] != g[:1] for t, g in zip(rollouts["response_text"], truths, strict=True)])
        )
    correct, redo, wrong_start = torch.cat(correct), torch.cat(redo), torch.cat(wrong_start)
    metrics = RE2.redo_metrics(correct, redo, "v")
    return {
        "redo_rate": metrics["v/redo_rate"],
        "accuracy_non_redo": metrics["v/accuracy_non_redo"],
        "expected_rounds": metrics["v/expected_rounds"],
        "redo_after_wrong_start": redo[wrong_start].double().mean().item(),
        "redo_after_right_start": redo[~wrong_start].double().mean().item(),
    }


def curve_to_budget(
    config: RunConfig,
    step_fn: Callable[[Runtime, Batch], Batch],
    measure: Callable[[Runtime], dict[str, float]],
    budget_tokens: float,
    eval_every_tokens: float,
    label: str,
) -> list[dict]:
    """Train with ``step_fn`` under `fit` until ``budget_tokens`` response tokens are generated; at the start
    and every ``eval_every_tokens`` one point: the tokens, steps and training seconds so far and
    ``measure(runtime)``, printed after ``label``."""
    curve: list[dict] = []

    def evaluate(runtime: Runtime, progress: Progress) -> dict[str, float]:
        point = {
            "tokens": progress.generated_tokens,
            "step": progress.steps,
            "train_s": progress.seconds,
            **measure(runtime),
        }
        curve.append(point)
        print(f"{label}: " + "  ".join(f"{key} {value:.4g}" for key, value in point.items()), flush=True)
        return {}

    with start_ray(config), Runtime(config) as runtime:
        fit(
            runtime,
            step_fn,
            stop=StopAt(generated_tokens=budget_tokens),
            evaluate=evaluate,
            evaluate_every=Every(generated_tokens=eval_every_tokens),
        )
    return curve


def run(name: str, model_dir: Path, data_dir: Path, args: argparse.Namespace) -> list[dict]:
    config_path, step_fn, overrides = ALGORITHMS[name]
    config = load_config(
        config_path,
        [
            *SHARED,
            *overrides,
            f"model.path={model_dir}",
            f"data.train_files=[{data_dir / 'train.parquet'}]",
            f"data.val_files=[{data_dir / 'test.parquet'}]",
            f"data.seed={args.seed}",
            f"rollout.seed={args.seed}",
            f"trainer.output_dir=outputs/bench_re2/{name}",
        ],
    )
    return curve_to_budget(
        config,
        step_fn,
        lambda runtime: held_out(runtime, args.samples),
        args.budget_tokens,
        args.eval_every_tokens,
        name,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-tokens", type=float, default=40000, help="generated tokens per algorithm")
    parser.add_argument("--eval-every-tokens", type=float, default=10000)
    parser.add_argument("--samples", type=int, default=2, help="sampled answers per held-out problem")
    parser.add_argument("--algos", nargs="+", default=list(ALGORITHMS), choices=list(ALGORITHMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="outputs/bench_re2/results.json")
    args = parser.parse_args()
    data_dir = DEMO.ensure_arithmetic_splits(DEMO.CACHE / "data")
    base, base_accuracy = warm_started_model(DEMO.demo_config(data_dir, 0, []), DEMO.CACHE, DEMO.WARM_START)
    model_dir, accuracy = TASK.redo_warm_started_model(
        base, data_dir, Path(".cache/recipes/re2"), TASK.RedoWarmStart()
    )
    print(
        f"warm start {base}: {base_accuracy:.1%}; with the redo habit {model_dir}: {accuracy:.1%} (HF greedy)"
    )
    results = {name: run(name, model_dir, data_dir, args) for name in args.algos}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\n{'tokens':>8} " + " ".join(f"{name + ' redo':>10} {name + ' acc':>9}" for name in args.algos))
    for i in range(max(len(curve) for curve in results.values())):
        cells = []
        for name in args.algos:
            curve = results[name]
            cells.append(
                f"{curve[i]['redo_rate']:>10.1%} {curve[i]['accuracy_non_redo']:>9.1%}"
                if i < len(curve)
                else " " * 20
            )
        print(f"{i * args.eval_every_tokens:>8.0f} " + " ".join(cells))
    for name in args.algos:
        last = results[name][-1]
        print(
            f"{name}: {last['step']} steps, {last['tokens']:.0f} tokens, {last['train_s']:.0f} s of training"
        )
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
