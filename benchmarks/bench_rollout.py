"""Rollout throughput: the vLLM engine against the HF ``generate`` engine, same model, same prompts.

A randomly initialised Qwen2 of ~34M parameters (vocab 8192, hidden 512, 8 layers, 8 heads with 4 KV
heads, MLP 1536) samples ``n`` responses for each of ``num_prompts`` prompts of random tokens with
lengths drawn uniformly from [16, 64], up to ``max_new_tokens`` each, at temperature 1. Both engines
run in this one process (the vLLM engine inside a one-process group: gloo, or nccl with ``--gpu``). The
HF engine runs first
because starting vLLM pins torch's thread settings for the rest of the process. Each engine gets one
untimed warm-up call (torch.compile, allocator) before the timed one.

Throughput counts generated tokens (the response masks' sum) per second of the timed ``generate``.
``--hf-prompts K`` times the HF engine on the first K prompts only: it generates ``--hf-batch-rows``
rows at a time, one batch after another, so K * n = hf-batch-rows rows measure the same rate in an
eighth of the time. Numbers and settings are in docs/rollout.md.

Run:  python benchmarks/bench_rollout.py [--dtype bfloat16] [--num-prompts 64] [--n 8]
          [--max-new-tokens 128] [--kv-cache-mib 1024] [--max-num-seqs 512] [--hf-batch-rows 64] [--hf-prompts K]
          [--engines vllm,hf] [--gpu]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.parallel import local_device_plan
from hybridflow.protocol import Batch
from hybridflow.rollout import (
    EngineDerived,
    HFRolloutEngine,
    RolloutConfig,
    RolloutEngine,
    SamplingParams,
    build_rollout_engine,
)

VOCAB = 8192
PAD, EOS = 0, 2
CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def random_prompts(num_prompts: int, min_len: int, max_len: int, seed: int) -> Batch:
    """``input_ids``/``attention_mask [num_prompts, max_len]``, left-padded, ids above the specials."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num_prompts,), generator=generator)
    input_ids = torch.randint(4, VOCAB, (num_prompts, max_len), generator=generator)
    mask = (torch.arange(max_len).unsqueeze(0) >= (max_len - lengths).unsqueeze(1)).long()
    return Batch({"input_ids": input_ids.masked_fill(mask == 0, PAD), "attention_mask": mask})


def timed_generate(engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> tuple[int, float]:
    """Generated tokens and wall seconds of one ``generate`` call, after one small warm-up call."""
    engine.generate(prompts[:2], SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=0))
    start = time.perf_counter()
    out = engine.generate(prompts, sampling)
    return int(out["response_mask"].sum()), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--kv-cache-mib", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=512)
    parser.add_argument("--hf-batch-rows", type=int, default=64)
    parser.add_argument(
        "--hf-prompts",
        type=int,
        default=None,
        help="time the HF engine on only the first K prompts: it generates hf-batch-rows rows at a "
        "time, so K * n = hf-batch-rows measures its rate in a fraction of the time (default: all)",
    )
    parser.add_argument("--engines", default="vllm,hf")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpu", action="store_true", help="run both engines on this process's GPU")
    args = parser.parse_args()
    engines = args.engines.split(",")
    dtype = getattr(torch, args.dtype)
    plan = local_device_plan(args.gpu)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if args.gpu:
        torch.cuda.set_device(plan.device)
    dist.init_process_group(plan.backend, rank=0, world_size=1)

    model = build_tiny_causal_lm(
        VOCAB,
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=1536,
        max_position_embeddings=512,
        seed=args.seed,
        dtype=dtype,
    )
    params = sum(p.numel() for p in model.parameters())
    prompts = random_prompts(args.num_prompts, 16, 64, args.seed)
    sampling = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    print(
        f"model: Qwen2 {params / 1e6:.1f}M params, {args.dtype}; {args.num_prompts} prompts x n={args.n}, "
        f"up to {args.max_new_tokens} new tokens; {plan.device}, torch threads {torch.get_num_threads()}"
    )

    results: dict[str, float] = {}
    if "hf" in engines:
        hf = HFRolloutEngine(
            model.to(plan.device), (EOS,), PAD, seed=args.seed, max_batch_rows=args.hf_batch_rows
        )
        hf_prompts = prompts if args.hf_prompts is None else prompts[: args.hf_prompts]
        tokens, seconds = timed_generate(hf, hf_prompts, sampling)
        results["hf"] = tokens / seconds
        print(
            f"hf:   {len(hf_prompts)} prompts x n={args.n}: {tokens} tokens in {seconds:.1f} s "
            f"= {results['hf']:.0f} tokens/s"
        )
    if "vllm" in engines:
        with tempfile.TemporaryDirectory() as model_dir:
            save_model_dir(model, None, model_dir)
            config = RolloutConfig(
                engine="vllm",
                seed=args.seed,
                kv_cache_bytes=args.kv_cache_mib << 20,
                max_num_seqs=args.max_num_seqs,
                enforce_eager=args.enforce_eager,
                cache_dir=str(CACHE_DIR),
            )
            start = time.perf_counter()
            derived = EngineDerived(dtype=args.dtype, max_model_len=64 + args.max_new_tokens)
            engine = build_rollout_engine(config, model_dir, derived, eos_token_ids=(EOS,), pad_token_id=PAD)
            print(f"vllm: engine start {time.perf_counter() - start:.1f} s")
            tokens, seconds = timed_generate(engine, prompts, sampling)
        results["vllm"] = tokens / seconds
        print(f"vllm: {tokens} tokens in {seconds:.1f} s = {results['vllm']:.0f} tokens/s")
    if len(results) == 2:
        print(f"ratio vllm / hf: {results['vllm'] / results['hf']:.1f}x")
    # vLLM's shutdown destroys the process group and then spends seconds in garbage collection.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
