"""LoRA against full fine-tuning at toy size: bytes pushed to the engine per step, and the optimizer state
and gradient memory of the update.

Two ranks in a gloo group (spawned processes, no Ray), each holding an FSDP2 shard of a random Qwen2
(fp32) and an HF engine on the same weights, run the actor's own pieces for each mode:

- **full**: every weight trains; the push streams the whole model;
- **lora-adapters**: ``hybridflow.lora.add_adapters`` (rank ``--rank``, alpha ``2 * rank``, every
  projection of attention and MLP), the engine holds the same adapters and the push carries them alone;
- **lora-merged**: the same adapters, pushed as full weights with the adapters merged in.

Per mode: one optimizer step on a random batch (``--rows`` rows of ``--length`` tokens per rank), after
which the optimizer state (AdamW's two moments and step) and the gradients are counted on each rank
(bytes of their local shards); then ``--pushes`` train -> inference -> train switches of the
`ReshardingManager` (the bytes handed to the engine per push, and the median seconds of the switch
to inference). Memory is per rank (rank 0; the shards are even).

Run:  python benchmarks/bench_lora.py [--sizes demo 25m] [--rank 8] [--pushes 5]
Results: docs/benchmarks.md ("LoRA").
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

from hybridflow.lora import LoraConfig, add_adapters
from hybridflow.models import build_tiny_causal_lm
from hybridflow.parallel import build_meshes, local_bytes, shard_model
from hybridflow.parallel.launch import run_ranks
from hybridflow.resharding.manager import ReshardingConfig, ReshardingManager
from hybridflow.rollout.hf_engine import HFRolloutEngine

SIZES = {
    # The demo's policy (docs/quickstart.md) and the 25M model of the earlier benchmarks.
    "demo": {"hidden_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 704},
    "25m": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1408},
}
VOCAB = 64
MODES = ("full", "lora-adapters", "lora-merged")


def _measure(rank: int, world: int, size: str, mode: str, lora_rank: int, rows: int, length: int, pushes: int):
    import time

    sizes = SIZES[size]
    lora = None if mode == "full" else LoraConfig(rank=lora_rank, alpha=2.0 * lora_rank)
    model = build_tiny_causal_lm(VOCAB, **sizes, seed=0)
    total_params = sum(p.numel() for p in model.parameters())
    if lora is not None:
        add_adapters(model, lora)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    meshes = build_meshes(world, 1, "cpu")
    model = shard_model(model, meshes.train)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    generator = torch.Generator().manual_seed(rank)
    ids = torch.randint(3, VOCAB, (rows, length), generator=generator)
    logits = model(input_ids=ids).logits
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
    grad_bytes = sum(local_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    optimizer.step()
    optimizer_bytes = sum(local_bytes(v) for state in optimizer.state.values() for v in state.values())
    engine_model = build_tiny_causal_lm(VOCAB, **sizes, seed=0)
    engine = HFRolloutEngine(engine_model, [2], 0, lora=lora if mode == "lora-adapters" else None)
    manager = ReshardingManager(model, engine, optimizer, ReshardingConfig(), torch.device("cpu"), lora=lora)
    seconds, pushed = [], []
    for _ in range(pushes):
        start = time.perf_counter()
        report = manager.to_inference()
        seconds.append(time.perf_counter() - start)
        pushed.append(report.bytes_streamed)
        manager.to_training()
    return {
        "params": total_params,
        "trainable": trainable,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": optimizer_bytes,
        "pushed_bytes": pushed[-1],
        "push_s": statistics.median(seconds),
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["demo", "25m"], choices=sorted(SIZES))
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank (alpha = 2 * rank)")
    parser.add_argument("--rows", type=int, default=4, help="rows per rank in the optimizer step")
    parser.add_argument("--length", type=int, default=64, help="tokens per row")
    parser.add_argument("--pushes", type=int, default=5, help="switches timed per mode (the median is shown)")
    args = parser.parse_args(argv)
    results = []
    print("| model | mode | params | trainable | grads / rank | optimizer / rank | pushed / step | push s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size in args.sizes:
        for mode in MODES:
            row = run_ranks(_measure, 2, size, mode, args.rank, args.rows, args.length, args.pushes)[0]
            results.append({"size": size, "mode": mode, **row})
            print(
                f"| {size} | {mode} | {row['params'] / 1e6:.2f}M | {row['trainable'] / 1e6:.3f}M "
                f"| {row['grad_bytes'] / 2**20:.2f} MiB | {row['optimizer_bytes'] / 2**20:.2f} MiB "
                f"| {row['pushed_bytes'] / 2**20:.2f} MiB | {row['push_s']:.3f} |",
                flush=True,
            )
    return results


if __name__ == "__main__":
    main()
