"""The actor's GRPO update against a plain padded PyTorch loop: same model, batch, threads and process.

Ours: `ActorRolloutRefWorker.update_actor` on one rank (a world of one gloo process: FSDP2 wrapping,
packed rows through the varlen SDPA, the token-mean clipped surrogate, grad-norm clip, AdamW), called in
this process without Ray. Baseline: the same Hugging Face model unwrapped, the batch padded to
``prompt + response`` columns in micro-batches of the same size, the same loss written out by hand,
clip and AdamW: what a single-process trainer such as TRL's does. Both run on ``--threads`` torch threads
on the same GRPO-shaped batch (the TRL comparison's 3.1M model and shape by default: 32 prompts x 8
samples, prompts of 4-6 tokens, responses of 2-16), one optimizer step per call; every row carries an
advantage, so nothing is skipped. Median of ``--rounds`` calls after two warm-up calls each.

``--model DIR`` runs a Hugging Face model folder instead (SmolLM2-135M-Instruct: ``recipes/smollm2``'s
``.cache/recipes/smollm2/model``) on ``--shape prompts,n,prompt_len,response_len,micro_rows``; both sides
then also print their model FLOP/s as a fraction of this machine's stored matmul peak for the dtype
(`hybridflow.metrics.efficiency`, ``python benchmarks/bench_machine_peak.py``), counting every row's prompt
(the update's own count shares a group's prompt on the packed side). ``--profile`` prints the operators
that took the most time in one of our updates. ``--keep-freed-host-memory`` sets
``actor.keep_freed_host_memory`` (for the whole process: the plain loop gets it too). ``--gather-once``
also times a second actor with ``actor.gather_once_per_mini_batch`` (the FSDP2 weights gathered once per optimizer step instead of
twice per micro-batch), the two actors' calls alternating, and prints the ratio; ``--lora-rank R`` likewise
times an actor that trains LoRA adapters of rank ``R`` (alpha ``2 R``, all seven projections) on the same
model, and ``--profile`` then profiles each actor.

    python benchmarks/bench_actor_update.py [--threads 2] [--rounds 5] [--dtype float32]
    python benchmarks/bench_actor_update.py --model .cache/recipes/smollm2/model --shape 8,8,40,48,8 \
        --rounds 2 --dtype bfloat16 [--plain-dtype bfloat16] [--profile] [--gather-once] [--no-plain]
"""

from __future__ import annotations

import argparse
import dataclasses
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
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from hybridflow.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from hybridflow.lora import LoraConfig, is_adapter_name  # noqa: E402
from hybridflow.metrics.efficiency import device_name, load_machine_peak, training_flops  # noqa: E402
from hybridflow.models import build_tiny_causal_lm, save_model_dir  # noqa: E402
from hybridflow.planning.model_shape import ModelShape  # noqa: E402
from hybridflow.protocol import Batch  # noqa: E402
from hybridflow.resharding.manager import ReshardingConfig  # noqa: E402
from hybridflow.rollout.config import RolloutConfig  # noqa: E402
from workers.actor import ActorRolloutRefWorker  # noqa: E402
from workers.config import ActorConfig, ActorDerived, RefConfig  # noqa: E402

CLIP = 0.2
TINY_SHAPE = "32,8,6,16,64"
"""The TRL comparison's ``tiny`` step: 32 prompts x 8 samples, prompts of 4-6 tokens, responses of 2-16,
micro-batches of 64 rows."""


def timed(fn, rounds: int) -> float:
    return timed_alternating([fn], rounds)[0]


def timed_alternating(fns: list, rounds: int) -> list[float]:
    """Median seconds of each of ``fns`` over ``rounds`` calls, the calls alternating between them so the
    host's drift hits all alike, after two warm-up calls each."""
    for fn in fns:
        fn()
        fn()
    seconds: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, times in zip(fns, seconds, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in seconds]


def plain_update(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, micro_rows: int
) -> None:
    """One clipped-surrogate AdamW step over ``batch`` on the padded ``[rows, prompt + response]`` layout."""
    prompt_len = batch["input_ids"].shape[1]
    ids = torch.cat([batch["input_ids"], batch["responses"]], dim=1)
    mask = torch.cat([batch["attention_mask"], batch["response_mask"]], dim=1)
    tokens = batch["response_mask"].sum()
    optimizer.zero_grad()
    for start in range(0, len(batch), micro_rows):
        rows = slice(start, start + micro_rows)
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
    parser.add_argument("--plain-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--model", type=Path, help="a Hugging Face model folder (default: the tiny 3.1M model)")
    parser.add_argument("--shape", default=TINY_SHAPE, help="prompts,n,prompt_len,response_len,micro_rows")
    parser.add_argument("--profile", action="store_true", help="print our update's costliest operators")
    parser.add_argument("--no-plain", action="store_true", help="time our update only")
    parser.add_argument(
        "--gather-once", action="store_true", help="also time actor.gather_once_per_mini_batch, alternating"
    )
    parser.add_argument(
        "--keep-freed-host-memory", action="store_true", help="actor.keep_freed_host_memory (this process)"
    )
    parser.add_argument(
        "--lora-rank", type=int, help="also time an actor with actor.lora of this rank (alpha 2 x rank), alternating"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    prompts, n, prompt_len, response_len, micro_rows = (int(v) for v in args.shape.split(","))
    rows = prompts * n
    model_dir = args.model or tiny_model_dir()
    vocab = AutoConfig.from_pretrained(model_dir).vocab_size
    batch = grpo_batch(prompts, n, prompt_len, response_len, 0.0, vocab)
    config = ActorConfig(
        ppo_mini_batch_size=rows, ppo_micro_batch_size=micro_rows, forward_micro_batch_size=micro_rows,
        lr=1e-4, weight_decay=0.0, param_dtype=args.dtype, keep_freed_host_memory=args.keep_freed_host_memory,
    )  # fmt: skip
    derived = ActorDerived(model_path=str(model_dir), objective=config.objective(), with_ref=False)

    def built_actor(actor_config: ActorConfig) -> ActorRolloutRefWorker:
        worker = ActorRolloutRefWorker(actor_config, RefConfig(), RolloutConfig(engine="hf"), ReshardingConfig(), derived)
        worker.init_model()
        return worker

    actor = built_actor(config)
    tokens = int(batch["attention_mask"].sum() + batch["response_mask"].sum())
    padded = rows * (batch["input_ids"].shape[1] + batch["responses"].shape[1])
    print(f"{rows} rows, {tokens} valid tokens ({padded} padded), {args.threads} threads")
    others = {}
    if args.gather_once:
        others["ours, gathered once per mini-batch"] = built_actor(
            dataclasses.replace(config, gather_once_per_mini_batch=True)
        )
    if args.lora_rank:
        lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        others[f"ours, LoRA rank {args.lora_rank}"] = built_actor(dataclasses.replace(config, lora=lora))
    actors = {"ours": actor, **others}
    seconds = timed_alternating(
        [lambda worker=worker: worker.update_actor(batch, temperature=1.0) for worker in actors.values()], args.rounds
    )
    ours = seconds[0]
    print(f"ours  update_actor (1 rank, packed, {args.dtype}):  {ours:.3f} s")
    sides = {"ours": (ours, args.dtype)}
    for side, other in zip(others, seconds[1:], strict=True):
        print(f"{side}:  {other:.3f} s ({ours / other:.2f}x)")
        sides[side] = (other, args.dtype)
    if not args.no_plain:
        plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.plain_dtype))
        optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-4, weight_decay=0.0)
        baseline = timed(lambda: plain_update(plain, optimizer, batch, micro_rows), args.rounds)
        print(f"plain padded loop ({args.plain_dtype}):  {baseline:.3f} s")
        print(f"plain / ours: {baseline / ours:.2f}x")
        sides["plain"] = (baseline, args.plain_dtype)
    adapters = {
        side: sum(p.numel() for name, p in worker.model.named_parameters() if is_adapter_name(name))
        for side, worker in actors.items()
    }
    print_fraction_of_peak(model_dir, batch, sides, adapters)
    if args.profile:
        for side, worker in actors.items():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
                worker.update_actor(batch, temperature=1.0)
            print(f"{side}:")
            print(profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
    dist.destroy_process_group()


def tiny_model_dir() -> Path:
    """The TRL comparison's 3.1M Qwen2 with the character tokenizer, saved to a temporary folder."""
    tokenizer = build_char_tokenizer()
    model_dir = Path(tempfile.mkdtemp(prefix="bench-actor-update-"))
    model = build_tiny_causal_lm(
        vocab_size=len(tokenizer), hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2,
        intermediate_size=768, max_position_embeddings=256, seed=0, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    save_model_dir(model, tokenizer, model_dir)
    return model_dir


def print_fraction_of_peak(
    model_dir: Path, batch: Batch, sides: dict[str, tuple[float, str]], adapters: dict[str, int]
) -> None:
    """Each side's training FLOP/s (`training_flops`, every row's prompt counted; a LoRA side's frozen
    weights get no weight gradient) against the stored matmul peak of its dtype on this machine."""
    shape = ModelShape.from_hf_config(AutoConfig.from_pretrained(model_dir).to_dict())
    lengths = batch["attention_mask"].sum(-1), batch["response_mask"].sum(-1)
    peak = load_machine_peak(device_name())
    for side, (seconds, dtype) in sides.items():
        rate = training_flops(shape, *lengths, adapter_parameters=adapters.get(side, 0)) / seconds
        fraction = f"{rate / peak.matmul_flops[dtype]:.3f} of the {dtype} peak" if peak else "no stored peak"
        print(f"{side}: {rate / 1e9:.1f} GFLOP/s, {fraction}")


if __name__ == "__main__":
    main()
