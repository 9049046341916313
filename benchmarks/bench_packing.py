"""Training throughput with sequence packing against padding, on a length-skewed batch.

One process, one small Qwen2 (~5M parameters), a batch shaped like RL rollouts: most sequences short, a
few long, padded to the longest. Each step is forward + backward + AdamW on the token-mean log-prob
loss. Three variants run interleaved (so load from other processes hits all alike):

* ``padded``: the padded batch through ``sdpa`` (pads cost compute);
* ``packed-sdpa``: valid tokens packed in one row, transformers' block-diagonal mask over the row;
* ``packed-varlen``: packed, with ``hybridflow_varlen_sdpa`` (one causal SDPA per sequence).

Throughput counts valid tokens only (the useful work).

    python benchmarks/bench_packing.py [--short 28 --short-len 64 --long 4 --long-len 1024] [--rounds 3]
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


def train_step(model, optimizer, fn, input_ids, mask) -> float:
    """Forward + backward + AdamW step; returns wall seconds."""
    start = time.perf_counter()
    out = fn(model, input_ids, mask, chunk_size=CHUNK)
    loss = -(out.log_probs.sum() / mask.sum())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=28, help="number of short sequences")
    parser.add_argument("--short-len", type=int, default=64, help="mean short length (tokens)")
    parser.add_argument("--long", type=int, default=4, help="number of long sequences")
    parser.add_argument("--long-len", type=int, default=1024, help="long length = padded length (tokens)")
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

    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for round_index in range(args.rounds + 1):
        for name, (fn, attn) in VARIANTS.items():
            model.set_attn_implementation(attn)
            seconds = train_step(model, optimizer, fn, input_ids, mask)
            if round_index > 0:  # the first round warms up allocators and kernels
                times[name].append(seconds)

    rate = {name: valid / statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(
            f"{name:14s} median {statistics.median(t):6.2f} s/step  {rate[name]:8.0f} tokens/s  (min {min(t):.2f} s)"
        )
    for name in ("packed-sdpa", "packed-varlen"):
        print(f"ratio {name} / padded: {rate[name] / rate['padded']:.2f}x")


if __name__ == "__main__":
    main()
