"""bf16 mixed precision against fp32 for an FSDP2 training step, on the CPU or (``--gpu``) a GPU.

Measures forward + backward + AdamW step time of a ~27M-parameter Qwen2 (FSDP2 over one rank, packed
log-prob loss) with ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` against fp32, and how
far the bf16 results are from fp32 ones: token log-probs (nats), gradients and the first update.

    python benchmarks/bench_precision.py [--iters 3] [--tokens 2048] [--threads 2]
    python benchmarks/bench_precision.py --hidden 256 --layers 4 --vocab 1024   # demo-sized, ~3M
    python benchmarks/bench_precision.py --gpu                                   # nccl, cuda:0

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
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.parallel import DevicePlan, build_meshes, local_device_plan, packed_log_probs, shard_model

# Variant name -> the param_dtype a config would name.
VARIANTS = {"fp32": "float32", "bf16": "bfloat16"}


def build_model(seed: int, attn: str, hidden: int, layers: int, vocab: int) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 128,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        attn_implementation=attn,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def init_single_rank(plan: DevicePlan) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if plan.device.type == "cuda":
        torch.cuda.set_device(plan.device)
    dist.init_process_group(plan.backend, rank=0, world_size=1)


def train_step(model, optimizer, input_ids, mask) -> tuple[float, float]:
    """One step; returns (wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = packed_log_probs(model, input_ids, mask)
    loss = -(out.log_probs.sum() / mask.sum())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if input_ids.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def full_grads(model) -> torch.Tensor:
    # float64: norms and dot products over 27M entries lose digits in fp32.
    return torch.cat([p.grad.full_tensor().flatten() for p in model.parameters()]).double()


def full_params(model) -> torch.Tensor:
    return torch.cat([p.detach().full_tensor().flatten() for p in model.parameters()]).double()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per step (rows of 256)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--hidden", type=int, default=512, help="hidden size (head_dim 64, 2 heads per KV head)"
    )
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--gpu", action="store_true", help="run on this process's GPU (nccl)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    plan = local_device_plan(args.gpu)
    init_single_rank(plan)
    device = plan.device
    mesh = build_meshes(1, 1, plan.device_type).train
    # One attention for both variants, so that only the precision differs: the one fp32 accepts.
    attn = plan.attn_implementation("float32")

    models, optimizers = {}, {}
    for name, param_dtype in VARIANTS.items():
        model = build_model(0, attn, args.hidden, args.layers, args.vocab).to(device)
        models[name] = shard_model(model, mesh, mp_policy=plan.mixed_precision(param_dtype))
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=1e-4)
    num_params = sum(p.numel() for p in models["fp32"].parameters())

    generator = torch.Generator().manual_seed(0)
    rows = args.tokens // 256
    input_ids = torch.randint(0, args.vocab, (rows, 256), generator=generator).to(device)
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

    # Wall time is stretched by other jobs on a shared host; CPU seconds of this process are not.
    wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.iters):
        for name in VARIANTS:
            wall_s, cpu_s = train_step(models[name], optimizers[name], input_ids, mask)
            wall[name].append(wall_s)
            cpu[name].append(cpu_s)

    lp_diff = (log_probs["bf16"] - log_probs["fp32"]).abs()
    grad_rel = (grads["bf16"] - grads["fp32"]).norm() / grads["fp32"].norm()
    grad_cos = torch.nn.functional.cosine_similarity(grads["bf16"], grads["fp32"], dim=0)
    update_rel = (updates["bf16"] - updates["fp32"]).norm() / updates["fp32"].norm()
    print(f"device={device} threads={args.threads} params={num_params / 1e6:.1f}M tokens/step={rows * 256}")
    tokens = rows * 256
    for name in VARIANTS:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"{name}: wall {w:.2f} s/step ({tokens / w:.0f} tokens/s)  cpu {c:.2f} s/step over {args.iters}"
        )
    print(
        f"speedup bf16 over fp32 (cpu s): {statistics.median(cpu['fp32']) / statistics.median(cpu['bf16']):.2f}x"
    )
    print(f"log-prob |bf16 - fp32| (nats): mean {lp_diff.mean():.2e} max {lp_diff.max():.2e}")
    print(f"gradient: relative error {grad_rel:.2e}, cosine {grad_cos:.6f}")
    print(f"first AdamW update: relative error {update_rel:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
