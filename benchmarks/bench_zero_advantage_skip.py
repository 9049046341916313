"""Actor update time with zero-advantage rows left out, against the update that computes every row.

Two 2-rank `ActorRolloutRefWorker` groups (real Ray, gloo, FSDP2) hold the same policy: one with
``actor.skip_zero_advantage_rows: auto`` (ours), one with ``false`` (the baseline). Both run
`update_actor` on the same GRPO-shaped batch, one after the other, round by round, so that load from
other processes hits both alike. The batch is the demo's step: ``--prompts`` groups of ``--n`` samples,
short prompts and answers; a share ``s`` of the groups, drawn at random, has zero advantage (all
samples scored the same), the others group-normalised random scores. The demo's shape is the default;
``group/zero_variance_frac`` in a run's metrics tells which share applies to it.

The rows go out in `balanced_update_order`, as the trainer sends them (both groups get the same batch).
The skipping group also runs the batch in its original order, to show what the balance adds: there the
ranks keep different numbers of rows and the step waits for the busier one.

The update is one on-policy optimizer step without ``old_log_probs``, as the demo runs it. Timing is the
controller's wall time of the call (both pay the same dispatch), the median over ``--rounds`` after one
warm-up round.

    python benchmarks/bench_zero_advantage_skip.py [--shares 0.25 0.5 0.75] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import ray
import torch

from hybridflow.controller import ResourcePool, RoleSpec, create_colocated_worker_groups
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rollout.config import RolloutConfig
from hybridflow.row_order import balanced_update_order
from workers.actor import ActorRolloutRefWorker
from workers.config import ActorConfig, ActorDerived, RefConfig


def grpo_batch(
    prompts: int, n: int, prompt_len: int, response_len: int, zero_share: float, vocab: int
) -> Batch:
    """``prompts * n`` rows in groups of ``n``; ``round(zero_share * prompts)`` groups have zero advantage."""
    generator = torch.Generator().manual_seed(0)
    rows = prompts * n
    prompt_lengths = torch.randint(prompt_len - 2, prompt_len + 1, (rows,), generator=generator)
    response_lengths = torch.randint(2, response_len + 1, (rows,), generator=generator)
    attention_mask = (torch.arange(prompt_len) >= prompt_len - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(response_len) < response_lengths[:, None]).long()
    scores = torch.randn(prompts, n, generator=generator)
    scores = (scores - scores.mean(dim=1, keepdim=True)) / scores.std(dim=1, keepdim=True)
    zero_groups = torch.randperm(prompts, generator=generator)[: round(zero_share * prompts)]
    scores[zero_groups] = 0.0
    return Batch(
        {
            "input_ids": torch.randint(4, vocab, (rows, prompt_len), generator=generator) * attention_mask,
            "attention_mask": attention_mask,
            "responses": torch.randint(4, vocab, (rows, response_len), generator=generator) * response_mask,
            "response_mask": response_mask,
            "advantages": scores.reshape(rows, 1) * response_mask,
        }
    )


def actor_group(model_dir: Path, config: ActorConfig, name: str):
    pool = ResourcePool([2], cpus_per_slot=0.5, name=name)
    spec = RoleSpec(
        ActorRolloutRefWorker,
        (
            config,
            RefConfig(),
            RolloutConfig(engine="hf"),
            ReshardingConfig(bucket_bytes=4 << 20),
            ActorDerived(model_path=str(model_dir), objective=config.objective(), with_ref=False),
        ),
    )
    group = create_colocated_worker_groups(pool, {"actor": spec}, name=name)["actor"]
    group.init_model()
    return group, pool


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shares", type=float, nargs="+", default=[0.25, 0.5, 0.75])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--response-len", type=int, default=6)
    parser.add_argument("--micro-batch-size", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=768)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    work = Path(tempfile.mkdtemp(prefix="hf-bench-skip-", dir="/tmp"))
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(
        len(tokenizer),
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=args.intermediate,
        max_position_embeddings=args.prompt_len + args.response_len,
    )
    params = sum(p.numel() for p in model.parameters())
    model_dir = save_model_dir(model, tokenizer, work / "policy")
    rows = args.prompts * args.n
    common = {
        "lr": 1e-4,
        "grad_clip": 1.0,
        "param_dtype": "float32",
        "ppo_mini_batch_size": rows,
        "ppo_micro_batch_size": args.micro_batch_size,
        "forward_micro_batch_size": args.micro_batch_size,
    }
    ray.init(num_cpus=8, include_dashboard=False, _temp_dir=str(work / "ray"), logging_level="WARNING")
    try:
        groups = {
            "skip": actor_group(model_dir, ActorConfig(**common), "skip"),
            "full": actor_group(model_dir, ActorConfig(**common, skip_zero_advantage_rows=False), "full"),
        }
        print(
            f"params={params / 1e6:.1f}M rows={rows} ({args.prompts} prompts x {args.n}) "
            f"prompt<={args.prompt_len} response<={args.response_len} tokens, 2 ranks, micro {args.micro_batch_size}"
        )
        print("zero-advantage groups | every row | skipping | speed-up | skipping, batch order | speed-up")
        for share in args.shares:
            batch = grpo_batch(
                args.prompts, args.n, args.prompt_len, args.response_len, share, len(tokenizer)
            )
            balanced = batch.reorder(balanced_update_order(batch, 2, rows))
            runs = {"full": (groups["full"][0], balanced), "skip": (groups["skip"][0], balanced)}
            runs["skip_batch_order"] = (groups["skip"][0], batch)
            seconds: dict[str, list[float]] = {name: [] for name in runs}
            for round_index in range(args.rounds + 1):
                for name, (group, rows_sent) in runs.items():
                    start = time.perf_counter()
                    metrics = group.update_actor(rows_sent, temperature=1.0)[0]
                    if round_index > 0:  # the first round warms up allocators and kernels
                        seconds[name].append(time.perf_counter() - start)
                    if name != "full":
                        assert metrics["actor/rows_skipped"] == round(share * args.prompts) * args.n
            full, skip, unbalanced = (statistics.median(seconds[name]) for name in runs)
            print(
                f"{share:21.0%} | {full:7.3f} s | {skip:6.3f} s | {full / skip:7.2f}x | "
                f"{unbalanced:19.3f} s | {full / unbalanced:7.2f}x"
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
