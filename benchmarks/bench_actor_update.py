"""The actor's GRPO update against a plain padded PyTorch loop: same model, batch, threads and process.

Ours: `ActorRolloutRefWorker.update_actor` on one rank (a world of one gloo process: FSDP2 wrapping,
packed rows through the varlen SDPA, the token-mean clipped surrogate, grad-norm clip, AdamW), called in
this process without Ray. Baseline: the same Hugging Face model unwrapped, the batch padded to
``prompt + response`` columns in micro-batches of the same size, the same loss written out by hand,
clip and AdamW: what a single-process trainer such as TRL's does. Both run on ``--threads`` torch threads
on the same GRPO-shaped batch (the TRL comparison's 3.1M model and shape by default: 32 prompts x 8
samples, prompts of 4-6 tokens, responses of 2-16), one optimizer step per call; every row carries an
advantage, so nothing is skipped. Median of ``--rounds`` calls after two warm-up calls each.

    python benchmarks/bench_actor_update.py [--threads 2] [--rounds 5] [--dtype float32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_zero_advantage_skip import grpo_batch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hybridflow.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from hybridflow.models import build_tiny_causal_lm, save_model_dir  # noqa: E402
from hybridflow.protocol import Batch  # noqa: E402
from hybridflow.resharding.manager import ReshardingConfig  # noqa: E402
from hybridflow.rollout.config import RolloutConfig  # noqa: E402
from workers.actor import ActorRolloutRefWorker  # noqa: E402
from workers.config import ActorConfig, ActorDerived, RefConfig  # noqa: E402

ROWS, MICRO_ROWS, CLIP = 256, 64, 0.2


def timed(fn, rounds: int) -> float:
    fn()
    fn()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def plain_update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch) -> None:
    """One clipped-surrogate AdamW step over ``batch`` on the padded ``[rows, prompt + response]`` layout."""
    prompt_len = batch["input_ids"].shape[1]
    ids = torch.cat([batch["input_ids"], batch["responses"]], dim=1)
    mask = torch.cat([batch["attention_mask"], batch["response_mask"]], dim=1)
    tokens = batch["response_mask"].sum()
    optimizer.zero_grad()
    for start in range(0, len(batch), MICRO_ROWS):
        rows = slice(start, start + MICRO_ROWS)
        logits = model(input_ids=ids[rows], attention_mask=mask[rows]).logits[:, prompt_len - 1 : -1].float()
        log_probs = torch.log_softmax(logits, -1).gather(-1, batch["responses"][rows, :, None])[..., 0]
        ratio = torch.exp(log_probs - log_probs.detach())
        advantages = batch["advantages"][rows]
        surrogate = torch.min(ratio * advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * advantages)
        (-(surrogate * batch["response_mask"][rows]).sum() / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="our compute dtype")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    tokenizer = build_char_tokenizer()
    model_dir = Path(tempfile.mkdtemp(prefix="bench-actor-update-"))
    model = build_tiny_causal_lm(
        vocab_size=len(tokenizer), hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2,
        intermediate_size=768, max_position_embeddings=256, seed=0, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    save_model_dir(model, tokenizer, model_dir)
    batch = grpo_batch(ROWS // 8, 8, 6, 16, 0.0, len(tokenizer))
    config = ActorConfig(
        ppo_mini_batch_size=ROWS, ppo_micro_batch_size=MICRO_ROWS, lr=1e-4, weight_decay=0.0, param_dtype=args.dtype
    )
    derived = ActorDerived(model_path=str(model_dir), objective=config.objective(), with_ref=False)
    actor = ActorRolloutRefWorker(
        config, RefConfig(), RolloutConfig(engine="hf"), ReshardingConfig(), derived
    )  # fmt: skip
    actor.init_model()
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-4, weight_decay=0.0)
    ours = timed(lambda: actor.update_actor(batch, temperature=1.0), args.rounds)
    baseline = timed(lambda: plain_update(plain, optimizer, batch), args.rounds)
    tokens = int(batch["attention_mask"].sum() + batch["response_mask"].sum())
    padded = ROWS * (batch["input_ids"].shape[1] + batch["responses"].shape[1])
    print(f"{ROWS} rows, {tokens} valid tokens ({padded} padded), {args.threads} threads, ours in {args.dtype}")
    print(f"ours  update_actor (1 rank, packed):  {ours:.3f} s")
    print(f"plain padded loop:                    {baseline:.3f} s")
    print(f"plain / ours: {baseline / ours:.2f}x")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
