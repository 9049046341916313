"""Latent rollout speed: the HF engine (``inputs_embeds`` with a KV cache) against vLLM (``prompt_embeds``,
one request per row and position, its prefix cache keyed by the vectors), same model, same prompts.

`recipes.latent_grpo.rollout.latent_rollout` feeds both engines the same inputs step by step: the latent
phase's soft embeddings, then explicit tokens as their embeddings. The model is Latent-GRPO's recipe size
(a Qwen2 of ~0.3M parameters with the character tokenizer, hidden 128, 2 layers) or, with ``--wide``, a
~34M one (hidden 512, 8 layers); its weights are random, and its end-of-thinking row of the output layer
is scaled up so that rows leave the latent phase after a few steps, as a trained model's do. Prompts are
2-digit additions. Both engines run in this one process (vLLM inside a one-process gloo group); the HF
engine first, because starting vLLM pins torch's thread settings. vLLM's CPU worker computes on one
thread, and so does the HF engine by default (``--threads``): on shared cores more threads made it
~25x slower (OpenMP spin-waits). Each engine gets one untimed warm-up, then the fastest of
``--repeats`` timed rollouts counts.
Both rollouts draw from the same seed, so they take the same path while their log-probs agree; the
script prints how many response tokens differ.

Run (from the repository root):  python -m benchmarks.bench_latent_rollout [--num-prompts 32] [--n 8] [--max-new-tokens 12] [--wide]
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

from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.rollout import (
    EngineDerived,
    HFRolloutEngine,
    RolloutConfig,
    SamplingParams,
    build_rollout_engine,
)
from recipes.latent_grpo.latent import LatentSampling
from recipes.latent_grpo.rollout import latent_rollout
from recipes.latent_grpo.task import END_OF_THINKING

CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def addition_prompts(tokenizer, num_prompts: int, seed: int) -> Batch:
    generator = torch.Generator().manual_seed(seed)
    pairs = torch.randint(10, 100, (num_prompts, 2), generator=generator).tolist()
    encoded = tokenizer([f"{a}+{b}=" for a, b in pairs], padding=True, return_tensors="pt")
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def timed_rollout(engine, embedding, prompts, sampling, latent, eos: int, repeats: int) -> tuple[Batch, float]:
    """One warm-up rollout on two prompts, then ``repeats`` timed ones (the same seed); the fastest."""

    def run(batch: Batch, params: SamplingParams) -> Batch:
        generator = torch.Generator().manual_seed(params.seed)
        return latent_rollout(engine.embedding_session, embedding, batch, params, latent, (eos,), 0, generator)

    run(prompts[:2], SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=1))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = run(prompts, sampling)
        best = min(best, time.perf_counter() - start)
    return out, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--wide", action="store_true", help="a ~34M model instead of the recipe's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of the HF engine (vLLM's CPU worker sets 1 for itself)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    dist.init_process_group("gloo", rank=0, world_size=1)

    tokenizer = build_char_tokenizer()
    size = (
        {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536}
        if args.wide
        else {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 256}
    )
    model = build_tiny_causal_lm(len(tokenizer), max_position_embeddings=64, seed=args.seed, **size)
    eot = tokenizer.convert_tokens_to_ids(END_OF_THINKING)
    with torch.no_grad():
        model.lm_head.weight[eot] *= 40
    embedding = model.get_input_embeddings().weight.detach().clone()
    prompts = addition_prompts(tokenizer, args.num_prompts, args.seed)
    sampling = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed)
    latent = LatentSampling(top_k=10, tau=1.0, noise_scale=1.0, end_of_thinking_id=eot)
    params = sum(p.numel() for p in model.parameters())
    rows = args.num_prompts * args.n
    print(
        f"model: Qwen2 {params / 1e6:.2f}M params, fp32; {args.num_prompts} prompts x n={args.n} = {rows} rows, "
        f"up to {args.max_new_tokens} positions; torch threads {torch.get_num_threads()}"
    )

    hf = HFRolloutEngine(model, (tokenizer.eos_token_id,), tokenizer.pad_token_id)
    hf_out, hf_s = timed_rollout(hf, embedding, prompts, sampling, latent, tokenizer.eos_token_id, args.repeats)
    positions = int(hf_out["response_mask"].sum())
    latent_steps = int(hf_out["latent_mask"].sum())
    print(f"hf:   {positions} positions ({latent_steps} latent) in {hf_s:.2f} s = {positions / hf_s:.0f} positions/s")
    with tempfile.TemporaryDirectory() as model_dir:
        save_model_dir(model, tokenizer, model_dir)
        config = RolloutConfig(
            engine="vllm",
            kv_cache_bytes=256 << 20,
            max_num_seqs=max(rows, 8),
            enable_prompt_embeds=True,
            cache_dir=str(CACHE_DIR),
        )
        start = time.perf_counter()
        vllm = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=64))
        print(f"vllm: engine start {time.perf_counter() - start:.1f} s")
        vllm_out, vllm_s = timed_rollout(
            vllm, embedding, prompts, sampling, latent, tokenizer.eos_token_id, args.repeats
        )
    vllm_positions = int(vllm_out["response_mask"].sum())
    print(f"vllm: {vllm_positions} positions in {vllm_s:.2f} s = {vllm_positions / vllm_s:.0f} positions/s")
    same = (vllm_out["responses"] == hf_out["responses"]).float().mean().item()
    print(f"response tokens equal between the engines: {same:.3f}")
    print(f"ratio hf / vllm (positions per second): {(positions / hf_s) / (vllm_positions / vllm_s):.1f}x")
    # vLLM's shutdown destroys the process group and then spends seconds in garbage collection.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
