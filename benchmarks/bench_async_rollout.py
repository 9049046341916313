"""Synchronous against one-step-off-policy GRPO on a long-tail task, on the same cores.

The task: every 10th prompt asks for a long answer. The policy is a random tiny Qwen2 (``--hidden``,
``--layers``, fp32) that almost never writes its end token, so a response's length is its budget: the
rollout worker of every side samples the long prompts with ``--long-tokens`` new tokens and the others
with ``--long-tokens / --tail-ratio`` (8x shorter by default), in two engine calls. Reward: the share
of a target character in the response (varied, so every step updates).

Three sides, each a fresh run of ``--steps`` GRPO steps (``trainer.algorithms.rl_step``), one after the
other, on ``--slots`` device slots in all (CPU processes of one core each):

- **sync colocated**: the default hybrid engine; the actor and its engine share every slot;
- **sync split**: the engine on a pool of one slot of its own, the actor on the rest
  (``async_rollout.max_staleness: 0``): each step pushes, waits for generation, trains;
- **one-step-off**: the same placement with ``async_rollout.max_staleness: 1``: the pool samples step
  t + 1 while step t trains.

Reported over the steps after the first (warm-up): generated response tokens per second of the whole
system (all tokens generated over the summed step wall time), the median step time, and the phase
split that explains them: the engine's generation seconds (``timing_s/generate``), the trainer's wait
for its batch (``async/trainer_wait_s``, or the whole generation phase when synchronous), the actor's
update, log-prob and weight-push seconds, and the rollout pool's seconds without work
(``async/pool_idle_s``; 0 for the colocated side). The ratios are one-step-off over each synchronous side. The
host's load (``os.getloadavg``) is printed before and after.

    RAY_AUTH_MODE=disabled python benchmarks/bench_async_rollout.py [--steps 6] [--prompts 20] [--n 4]
        [--long-tokens 128] [--tail-ratio 8] [--hidden 128] [--layers 4] [--slots 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from hybridflow.data import write_rows
from hybridflow.metrics import read_jsonl
from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.sampling import SamplingParams
from trainer.algorithms import rl_step
from trainer.config import load_config
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from workers.actor import ActorRolloutRefWorker
from workers.rollout import RolloutWorker

TAIL_EVERY = 10
"""Every 10th prompt is a long one: 10% of the prompts."""

REWARD = '''
def target_share(data_source, solution_str, ground_truth, extra_info=None):
    return solution_str.count(ground_truth) / max(1, len(solution_str))
'''


def long_tail_sample(engine: RolloutEngine, prompts: Batch, sampling: SamplingParams, short_tokens: int) -> Batch:
    """``engine.generate`` with a budget per prompt: ``sampling.max_new_tokens`` for the prompts whose
    ``extra_info["long"]`` is set, ``short_tokens`` for the others; rows in the order of one call
    (``n`` per prompt), response columns ``[rows, sampling.max_new_tokens]``."""
    long = np.array([bool(info.get("long")) for info in prompts["extra_info"]])
    width = sampling.max_new_tokens
    parts, order = [], []
    for flag, budget in ((False, short_tokens), (True, width)):
        index = np.flatnonzero(long == flag)
        if not len(index):
            continue
        part = engine.generate(prompts.reorder(index), dataclasses.replace(sampling, max_new_tokens=budget))
        pad = width - budget
        part = part.select(*[k for k in part.keys() if k not in ("responses", "response_mask", "rollout_log_probs")]) | Batch(
            {
                "responses": torch.nn.functional.pad(part["responses"], (0, pad), value=engine.pad_token_id),
                "response_mask": torch.nn.functional.pad(part["response_mask"], (0, pad)),
                "rollout_log_probs": torch.nn.functional.pad(part["rollout_log_probs"], (0, pad)),
            }
        )
        parts.append(part)
        order += [prompt * sampling.n + j for prompt in index.tolist() for j in range(sampling.n)]
    merged = Batch.concat(parts)
    return merged.reorder(np.argsort(order))


class LongTailActor(ActorRolloutRefWorker):
    """The shipped actor; its colocated engine samples with a budget per prompt (``short_tokens``, set
    by `main` before the workers start: the class travels to them with its attributes)."""

    short_tokens = 16

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        return long_tail_sample(engine, prompts, sampling, self.short_tokens)


class LongTailRollout(RolloutWorker):
    """The shipped rollout worker; its engine samples with a budget per prompt, as `LongTailActor`."""

    short_tokens = 16

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        return long_tail_sample(engine, prompts, sampling, self.short_tokens)


def _write_task(root: Path, count: int) -> None:
    rows = [
        {
            "data_source": "toy/long_tail",
            "prompt": [{"role": "user", "content": f"{i % 10}{chr(97 + i % 7)}="}],
            "reward_model": {"ground_truth": "7"},
            "extra_info": {"long": i % TAIL_EVERY == 0},
        }
        for i in range(count)
    ]
    write_rows(rows, root / "train.parquet")
    (root / "reward.py").write_text(REWARD)


def task_overrides(root: Path, args: argparse.Namespace, side: str) -> list[str]:
    """The config overrides of the long-tail task's GRPO run for ``side`` (its output folder), before
    any placement or asynchrony (bench_partial_rollout.py runs the same task)."""
    return [
        f"data.train_files=[{root / 'train.parquet'}]",
        "data.max_prompt_length=8",
        f"data.max_response_length={args.long_tokens}",
        f"data.train_batch_size={args.prompts}",
        "data.shuffle=false",
        f"model.tiny.hidden_size={args.hidden}",
        f"model.tiny.num_layers={args.layers}",
        "model.tiny.num_heads=4",
        "model.tiny.num_kv_heads=4",
        f"model.tiny.intermediate_size={3 * args.hidden}",
        f"model.tiny.max_position_embeddings={args.long_tokens + 16}",
        "rollout.engine=hf",
        f"rollout.n={args.n}",
        "actor.param_dtype=float32",
        "actor.lr=1e-4",
        f"actor.ppo_mini_batch_size={args.prompts * args.n}",
        # Micro-batches that divide every side's per-rank mini-batch.
        f"actor.ppo_micro_batch_size={args.prompts * args.n // (2 * args.slots)}",
        f"actor.forward_micro_batch_size={args.prompts * args.n // (2 * args.slots)}",
        f"reward.default_fn={root / 'reward.py'}:target_share",
        "reward.num_workers=1",
        f"trainer.total_steps={args.steps}",
        "trainer.val_before_train=false",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={root / side}",
        "resource.cpus_per_slot=1",
    ]


def _config(root: Path, args: argparse.Namespace, side: str) -> object:
    overrides = task_overrides(root, args, side)
    if side == "sync colocated":
        overrides.append(f"resource.slots_per_node={args.slots}")
    else:
        overrides += [
            f"resource.slots_per_node={args.slots - 1}",
            "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
            "resource.placement={rollout: rollout_pool}",
            f"async_rollout.max_staleness={1 if side == 'one-step-off' else 0}",
            "actor.rollout_correction=token",
        ]
    return load_config(None, overrides)


def _run(root: Path, args: argparse.Namespace, side: str) -> dict[str, float]:
    config = _config(root, args, side)
    classes = {"actor_rollout": LongTailActor, "rollout": LongTailRollout}
    if side == "sync colocated":
        classes.pop("rollout")
    with start_ray(config), Runtime(config, worker_classes=classes) as runtime:
        fit(runtime, rl_step)
    log = read_jsonl(root / side / "metrics.jsonl")[1:]  # the first step warms up
    seconds = [r["timing_s/step"] for r in log]

    def total(key: str) -> float:
        return sum(r.get(key, 0.0) for r in log) / len(log)

    wait = "async/trainer_wait_s" if side != "sync colocated" else "timing_s/generation"
    return {
        "tokens_per_s": sum(r["response/generated_tokens"] for r in log) / sum(seconds),
        "step_s": statistics.median(seconds),
        "generate_s": total("timing_s/generate"),
        "wait_s": total(wait),
        "update_s": total("timing_s/update"),
        "log_prob_s": total("timing_s/log_prob"),
        "push_s": total("timing_s/weight_push"),
        "pool_idle_s": total("async/pool_idle_s"),
        "staleness": total("async/staleness_mean"),
    }


def task_parser(description: str, steps: int) -> argparse.ArgumentParser:
    """The command line of the long-tail task's benchmarks (this one and bench_partial_rollout.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=128)
    parser.add_argument("--tail-ratio", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=2)
    return parser


def main() -> None:
    parser = task_parser(__doc__, steps=6)
    args = parser.parse_args()
    if args.slots < 2:
        parser.error("--slots must be at least 2: the split sides need a slot for the actor and one for the engine")
    LongTailActor.short_tokens = LongTailRollout.short_tokens = args.long_tokens // args.tail_ratio
    print(f"load before: {os.getloadavg()}")
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        _write_task(root, args.prompts * args.steps)
        for side in ("sync colocated", "sync split", "one-step-off"):
            results[side] = _run(root, args, side)
            print(side, results[side], flush=True)
    print(f"load after: {os.getloadavg()}")
    print(
        f"model: hidden {args.hidden}, {args.layers} layers, fp32; {args.prompts} prompts x {args.n} samples per step, "
        f"10% of prompts with {args.long_tokens} new tokens, the rest {args.long_tokens // args.tail_ratio}; "
        f"{args.slots} slots; steps 2..{args.steps}"
    )
    header = (
        "side", "tokens/s", "step s", "generate s", "wait s", "update s", "log-prob s", "push s", "pool idle s",
        "staleness",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    keys = ("tokens_per_s", "step_s", "generate_s", "wait_s", "update_s", "log_prob_s", "push_s", "pool_idle_s")
    for side, row in results.items():
        print(f"| {side} | " + " | ".join(f"{row[k]:.2f}" for k in (*keys, "staleness")) + " |")
    off = results["one-step-off"]["tokens_per_s"]
    for side in ("sync colocated", "sync split"):
        print(f"one-step-off / {side}: {off / results[side]['tokens_per_s']:.2f}x generated tokens per second")


if __name__ == "__main__":
    main()
