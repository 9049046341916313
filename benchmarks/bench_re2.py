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
import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hybridflow.algos.masked import last_valid_token_mask  # noqa: E402
from hybridflow.data import PromptLoader  # noqa: E402
from hybridflow.protocol import Batch  # noqa: E402
from hybridflow.rollout.sampling import SamplingParams  # noqa: E402
from tests.recipes._load import load_recipe  # noqa: E402
from trainer.config import load_config, recipe_settings  # noqa: E402
from trainer.ray_runtime import start_ray  # noqa: E402
from trainer.rl_trainer import RLTrainer  # noqa: E402
from trainer.steps import advantages, generate, old_log_probs, update_actor  # noqa: E402
from trainer.warm_start import warm_started_model  # noqa: E402

DEMO, DAPO, RE2 = load_recipe("arithmetic_demo"), load_recipe("dapo"), load_recipe("re2")
TASK = sys.modules["re2_task"]
REDO = RE2.Re2Settings()  # the redo phrase and what counts as an answer after it, for both algorithms
SHARED = [
    "trainer.total_steps=100000",
    "trainer.val_every=0",
    "trainer.val_before_train=false",
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


class BudgetSpent(Exception):
    """Raised by the counting step when the algorithm's token budget is used up."""


def dapo_step(trainer: RLTrainer, prompts: Batch) -> Batch:
    """recipes/dapo's step with old log-probs before the update (8 optimizer steps per batch, as re2),
    counting the tokens every round generated in ``bench/generated_tokens``."""
    settings = recipe_settings(trainer.config, DAPO.DapoSettings)
    redo = RE2.as_written(trainer.tokenizer, REDO)
    generated = 0

    def sample_round(round_index: int) -> Batch:
        nonlocal generated
        rollouts = generate(trainer, prompts if round_index == 0 else trainer.next_prompts())
        generated += int(rollouts["response_lengths"].sum())
        # The same rules as re2's: the phrase ends the response, and a redo is no answer (it scores 0).
        rollouts = RE2.ended_at_redo(trainer, rollouts, redo.redo_phrase)
        correct, _ = RE2.judged(trainer, rollouts, redo)
        last = last_valid_token_mask(rollouts["response_mask"].bool())
        return rollouts | Batch(
            {"scores": correct.float(), "token_level_scores": last.float() * correct[:, None]}
        )

    rollouts, metrics = DAPO.fill_batch(
        sample_round,
        len(prompts),
        trainer.config.rollout.n,
        settings.max_rounds,
        trainer.tokenizer.pad_token_id,
    )
    trainer.record({**metrics, "bench/generated_tokens": float(generated)})
    if rollouts is None:
        return prompts
    rollouts = RE2.with_trainer_log_prob_at_appended_eos(rollouts | old_log_probs(trainer, rollouts))
    rollouts |= advantages(trainer, rollouts)
    update_actor(trainer, DAPO.without_truncated_tokens(rollouts))
    return rollouts


def re2_step(trainer: RLTrainer, prompts: Batch) -> Batch:
    rollouts = RE2.re2_step(trainer, prompts)
    trainer.record({"bench/generated_tokens": trainer.step_metrics["re2/generated_tokens"]})
    return rollouts


ALGORITHMS: dict[str, tuple[Path, Callable[[RLTrainer, Batch], Batch], list[str]]] = {
    "re2": (REPO / "recipes" / "re2" / "config.yaml", re2_step, ["data.train_batch_size=4"]),
    "dapo": (
        REPO / "recipes" / "dapo" / "config.yaml",
        dapo_step,
        [
            "data.train_batch_size=32",
            "reward.shaping=[]",
            "recipe.max_rounds=4",
            "recipe.filter_truncated=true",
        ],
    ),
}


def held_out(trainer: RLTrainer, samples: int) -> dict[str, float]:
    """``samples`` sampled answers per held-out problem, cut after the redo phrase: redo rate, accuracy over
    non-redo samples, expected rounds, and how often a sample redoes after a wrong and after a right first
    digit (the digit before the phrase: a redo is worth something only after a wrong one)."""
    redo_settings = RE2.as_written(trainer.tokenizer, REDO)
    sampling = SamplingParams(
        n=samples, temperature=1.0, max_new_tokens=trainer.config.data.max_response_length, seed=0
    )
    loader = PromptLoader(
        trainer.val_data, 250, trainer.tokenizer.pad_token_id, shuffle=False, drop_last=False
    )
    correct, redo, wrong_start = [], [], []
    for prompts in loader:
        rollouts = trainer.actor.generate_sequences(prompts, sampling)
        rollouts = RE2.ended_at_redo(trainer, rollouts, redo_settings.redo_phrase)
        right, flags = RE2.judged(trainer, rollouts, redo_settings)
        correct.append(right)
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
    curve: list[dict] = []
    spent = {"tokens": 0.0, "next_eval": 0.0, "train_s": 0.0}

    def evaluate(trainer: RLTrainer) -> None:
        point = {
            "tokens": spent["tokens"],
            "step": trainer.step - 1,
            "train_s": spent["train_s"],
            **held_out(trainer, args.samples),
        }
        curve.append(point)
        print(
            f"{name:>5} step {point['step']:>4} tokens {point['tokens']:>8.0f} "
            f"train {point['train_s']:>6.0f} s  "
            f"redo {point['redo_rate']:.1%}  accuracy (non-redo) {point['accuracy_non_redo']:.1%}  "
            f"rounds {point['expected_rounds']:.2f}  redo after a wrong / right first digit "
            f"{point['redo_after_wrong_start']:.1%} / {point['redo_after_right_start']:.1%}",
            flush=True,
        )
        spent["next_eval"] += args.eval_every_tokens

    def counted_step(trainer: RLTrainer, prompts: Batch) -> Batch:
        if spent["tokens"] >= spent["next_eval"]:
            evaluate(trainer)
        if spent["tokens"] >= args.budget_tokens:
            raise BudgetSpent
        started = time.perf_counter()
        rollouts = step_fn(trainer, prompts)
        spent["train_s"] += time.perf_counter() - started
        spent["tokens"] += trainer.step_metrics["bench/generated_tokens"]
        return rollouts

    with start_ray(config), RLTrainer(config) as trainer, contextlib.suppress(BudgetSpent):
        trainer.fit(counted_step)
    return curve


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
