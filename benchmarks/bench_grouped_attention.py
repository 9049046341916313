"""bf16 attention on CPU: the explicit grouped-head attention against PyTorch's SDPA kernels.

Two levels, each variant interleaved ``--rounds`` times in this one process (host load hits all alike),
median milliseconds printed with the ratio to ours:

* **one attention call**, forward + backward, bf16: the shapes of the 3.1M TRL-comparison model (8
  heads, 2 KV heads, head_dim 32). ``bucket``: one shared-prefix bucket of ``--segments`` branches of 15
  queries against 21 keys; ``decode``: one decoding step, 1 query against 23 keys, forward only,
  under a padding mask and without one (rows of one prompt length). Variants:
  `grouped_masked_attention` (ours), SDPA as dispatched (its flash kernel on CPU), SDPA's math backend.
* **the model**: `shared_prefix_log_probs` forward + backward of that 3.1M model in bf16 on 32 prompts x
  8 responses of 16 tokens (prompts of 4-6), in micro-batches of 64 rows, with the explicit attention
  (the default for bf16 on CPU) and with every bucket sent to SDPA instead (the path before it).

    python benchmarks/bench_grouped_attention.py [--threads 2] [--rounds 7] [--segments 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from unittest import mock

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from hybridflow.models import build_tiny_causal_lm
from hybridflow.parallel import VARLEN_SDPA, shared_prefix, shared_prefix_log_probs
from hybridflow.parallel.grouped_attention import grouped_masked_attention

HEADS, KV_HEADS, HEAD_DIM = 8, 2, 32


def interleaved_medians(variants: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Median seconds of each variant, run in turn ``rounds`` times after one warm-up each."""
    for fn in variants.values():
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            start = time.perf_counter()
            fn()
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def attention_variants(
    segments: int, q_len: int, kv_len: int, backward: bool, masked: bool = True
) -> dict[str, Callable[[], None]]:
    generator = torch.Generator().manual_seed(0)

    def tensor(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).bfloat16().requires_grad_(backward)

    query = tensor(segments, HEADS, q_len, HEAD_DIM)
    key, value = tensor(segments, KV_HEADS, kv_len, HEAD_DIM), tensor(segments, KV_HEADS, kv_len, HEAD_DIM)
    # Each query sees the keys up to its own position (the branch continues the prompt).
    mask = torch.ones(segments, 1, q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len) if masked else None

    def run(attend: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def call() -> None:
            out = attend()
            if backward:
                out.float().sum().backward()

        return call

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)

    def math() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.MATH):
            return sdpa()

    return {
        "ours": run(lambda: grouped_masked_attention(query, key, value, mask, None)),
        "sdpa (flash)": run(sdpa),
        "sdpa (math)": run(math),
    }


def model_variants() -> dict[str, Callable[[], None]]:
    model = build_tiny_causal_lm(
        vocab_size=20, hidden_size=256, num_layers=4, num_heads=HEADS, num_kv_heads=KV_HEADS,
        intermediate_size=768, max_position_embeddings=256, seed=0,
    ).to(torch.bfloat16)  # fmt: skip
    model.set_attn_implementation(VARLEN_SDPA)
    generator = torch.Generator().manual_seed(0)
    rows, prompt_width, response_len = 256, 6, 16
    group = torch.arange(rows) // 8
    lengths = torch.randint(4, prompt_width + 1, (rows // 8,), generator=generator)[group]
    prompt_mask = (torch.arange(prompt_width) >= prompt_width - lengths[:, None]).long()
    prompt_ids = torch.randint(3, 20, (rows // 8, prompt_width), generator=generator)[group] * prompt_mask
    responses = torch.randint(3, 20, (rows, response_len), generator=generator)
    response_mask = torch.ones_like(responses)

    def step() -> None:
        for start in range(0, rows, 64):
            part = slice(start, start + 64)
            out = shared_prefix_log_probs(
                model, prompt_ids[part], prompt_mask[part], responses[part], response_mask[part]
            )
            out.log_probs.float().sum().backward()

    def step_with_sdpa() -> None:
        with mock.patch.object(shared_prefix, "prefers_explicit_attention", lambda *args: False):
            step()

    return {"ours": step, "sdpa (flash)": step_with_sdpa}


def report(title: str, medians: dict[str, float]) -> None:
    print(title)
    for name, seconds in medians.items():
        ratio = "" if name == "ours" else f"  ({seconds / medians['ours']:.2f}x ours)"
        print(f"  {name:<14} {seconds * 1e3:8.2f} ms{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--segments", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"bf16, {args.threads} threads, medians of {args.rounds} interleaved rounds")
    bucket = attention_variants(args.segments, 15, 21, backward=True)
    report(f"bucket: {args.segments} segments x 15 queries x 21 keys, forward + backward",
           interleaved_medians(bucket, args.rounds))  # fmt: skip
    for masked in (True, False):
        decode = attention_variants(args.segments, 1, 23, backward=False, masked=masked)
        report(f"decode: {args.segments} rows x 1 query x 23 keys, forward, {'masked' if masked else 'no mask'}",
               interleaved_medians(decode, args.rounds))  # fmt: skip
    report("model: 3.1M, 256 rows (32 prompts x 8), 4 micro-batches, forward + backward",
           interleaved_medians(model_variants(), args.rounds))  # fmt: skip


if __name__ == "__main__":
    main()
