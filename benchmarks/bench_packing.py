"""Training throughput with sequence packing against padding, on a length-skewed batch.

One process, one small Qwen2 (~5M parameters), a batch shaped like RL rollouts: most sequences short, a
few long, padded to the longest. Each step is forward + backward + AdamW on the token-mean log-prob
loss. Three variants run interleaved (so load from other processes hits all alike):

* ``padded``: the padded batch through ``sdpa`` (pads cost compute);
* ``packed-sdpa``: valid tokens packed in one row, transformers' block-diagonal mask over the row;
* ``packed-varlen``: packed, with ``hybridflow_varlen_sdpa`` (one causal SDPA per sequence).

Throughput counts valid tokens only (the useful work), per wall second and per CPU second of the
process (the latter is what to compare on a host shared with other jobs).

    python benchmarks/bench_packing.py [--short 30 --short-len 48 --long 2 --long-len 512] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.parallel import VARLEN_SDPA, packed_log_probs, padded_log_probs

VOCAB = 8192
CHUNK = 4096
VARIANTS = {
    "padded": (padded_log_probs, "sdpa"),
    "packed-sdpa": (packed_log_probs, "sdpa"),
    "packed-varlen": (packed_log_probs, VARLEN_SDPA),
}


def build_model() -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def skewed_batch(short: int, short_len: int, long: int, long_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids, attention_mask [short + long, long_len]``, right-padded, short lengths jittered."""
    generator = torch.Generator().manual_seed(0)
    lengths = [long_len] * long + [
        int(n) for n in torch.randint(short_len // 2, short_len * 3 // 2 + 1, (short,), generator=generator)
    ]
    input_ids = torch.randint(0, VOCAB, (len(lengths), long_len), generator=generator)
    mask = (torch.arange(long_len) < torch.tensor(lengths).unsqueeze(1)).long()
    return input_ids, mask


def train_step(model, optimizer, fn, input_ids, mask) -> tuple[float, float]:
    """Forward + backward + AdamW step; returns (wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn(model, input_ids, mask, chunk_size=CHUNK)
    loss = -(out.log_probs.sum() / mask.sum())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=30, help="number of short sequences")
    parser.add_argument("--short-len", type=int, default=48, help="mean short length (tokens)")
    parser.add_argument("--long", type=int, default=2, help="number of long sequences")
    parser.add_argument("--long-len", type=int, default=512, help="long length = padded length (tokens)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    input_ids, mask = skewed_batch(args.short, args.short_len, args.long, args.long_len)
    valid = int(mask.sum())
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    num_params = sum(p.numel() for p in model.parameters())
    print(
        f"params={num_params / 1e6:.1f}M batch={tuple(input_ids.shape)} valid tokens={valid} "
        f"({valid / input_ids.numel():.0%} of the padded batch) threads={args.threads}"
    )

    # CPU seconds are reported next to wall seconds because other jobs on a shared host stretch wall
    # time; the ratios use CPU seconds.
    wall: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cpu: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds + 1):
        for name, (fn, attn) in VARIANTS.items():
            model.set_attn_implementation(attn)
            wall_s, cpu_s = train_step(model, optimizer, fn, input_ids, mask)
            if round_index > 0:  # the first round warms up allocators and kernels
                wall[name].append(wall_s)
                cpu[name].append(cpu_s)

    per_cpu_s = {name: valid / statistics.median(t) for name, t in cpu.items()}
    for name in VARIANTS:
        print(
            f"{name:14s} wall {statistics.median(wall[name]):6.2f} s/step ({valid / statistics.median(wall[name]):6.0f} "
            f"tokens/s)  cpu {statistics.median(cpu[name]):6.2f} s/step ({per_cpu_s[name]:6.0f} tokens/cpu-s)"
        )
    for name in ("packed-sdpa", "packed-varlen"):
        print(f"ratio {name} / padded (tokens per cpu-s): {per_cpu_s[name] / per_cpu_s['padded']:.2f}x")


if __name__ == "__main__":
    main()
