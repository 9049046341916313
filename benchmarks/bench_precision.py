"""bf16 mixed precision against fp32 for an FSDP2 training step on this machine's device.

Measures forward + backward + AdamW step time of a ~27M-parameter Qwen2 (FSDP2 over one rank, packed
log-prob loss) with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` against fp32, and how
far the bf16 results are from fp32 ones: token log-probs (nats), gradients and the first update.

    python benchmarks/bench_precision.py [--iters 5] [--tokens 2048] [--threads 2]

The two variants run interleaved, so load from other processes on the host hits both alike.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.parallel import build_meshes, default_device_type, packed_log_probs, shard_model

VARIANTS = {
    "fp32": MixedPrecisionPolicy(),
    "bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
}


def build_model(seed: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=16384,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def init_single_rank() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)


def train_step(model, optimizer, input_ids, mask) -> tuple[float, torch.Tensor]:
    """One step; returns its wall time in seconds and the token log-probs ``[batch, seq_len]``."""
    start = time.perf_counter()
    out = packed_log_probs(model, input_ids, mask)
    loss = -(out.log_probs.sum() / mask.sum())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if input_ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start, out.log_probs.detach()


def full_grads(model) -> torch.Tensor:
    return torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()])


def full_params(model) -> torch.Tensor:
    return torch.cat([p.detach().full_tensor().flatten() for p in model.parameters()])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per step (rows of 256)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    init_single_rank()
    device = default_device_type()
    mesh = build_meshes(1, 1, device).train

    models, optimizers = {}, {}
    for name, policy in VARIANTS.items():
        models[name] = shard_model(build_model(seed=0).to(device), mesh, mp_policy=policy)
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-4)
    num_params = sum(p.numel() for p in models["fp32"].parameters())

    generator = torch.Generator().manual_seed(0)
    rows = args.tokens // 256
    input_ids = torch.randint(0, 16384, (rows, 256), generator=generator).to(device)
    mask = torch.ones_like(input_ids)

    # First step from identical weights: compare results, then keep timing.
    before = full_params(models["fp32"])
    log_probs, grads, updates = {}, {}, {}
    for name in VARIANTS:
        out = packed_log_probs(models[name], input_ids, mask)
        loss = -(out.log_probs.sum() / mask.sum())
        loss.backward()
        log_probs[name], grads[name] = out.log_probs.detach(), full_grads(models[name])
        optimizers[name].step()
        optimizers[name].zero_grad()
        updates[name] = full_params(models[name]) - before

    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.iters):
        for name in VARIANTS:
            seconds, _ = train_step(models[name], optimizers[name], input_ids, mask)
            times[name].append(seconds)

    lp_diff = (log_probs["bf16"] - log_probs["fp32"]).abs()
    grad_rel = (grads["bf16"] - grads["fp32"]).norm() / grads["fp32"].norm()
    grad_cos = torch.nn.functional.cosine_similarity(grads["bf16"], grads["fp32"], dim=0)
    update_rel = (updates["bf16"] - updates["fp32"]).norm() / updates["fp32"].norm()
    print(f"device={device} threads={args.threads} params={num_params / 1e6:.1f}M tokens/step={rows * 256}")
    for name in VARIANTS:
        median = statistics.median(times[name])
        print(f"{name}: step median {median:.3f} s ({rows * 256 / median:.0f} tokens/s) over {args.iters}")
    ratio = statistics.median(times["fp32"]) / statistics.median(times["bf16"])
    print(f"speedup bf16 over fp32: {ratio:.2f}x")
    print(f"log-prob |bf16 - fp32| (nats): mean {lp_diff.mean():.2e} max {lp_diff.max():.2e}")
    print(f"gradient: relative error {grad_rel:.2e}, cosine {grad_cos:.6f}")
    print(f"first AdamW update: relative error {update_rel:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
