"""Shared-prefix packing against plain packing: forward + backward of one GRPO micro-batch.

One process, by default the 3.1M Qwen2 of the TRL comparison (hidden 256, 4 layers, 8 / 2 heads, MLP
768, a 20-token vocabulary; ``--shape smollm2``: SmolLM2-135M's shape, randomly initialised), one micro-batch of ``--prompts`` prompts x ``--samples`` responses, every prompt
``--prompt-len`` tokens and every response ``--response-len``. Both variants compute the response
tokens' log-probs and backpropagate their sum, interleaved ``--rounds`` times (so host load hits both
alike):

* ``packed``: `packed_log_probs` on the joined rows (each row's prompt computed again);
* ``shared``: `shared_prefix_log_probs` (each prompt once, its responses as branches).

Prints the median seconds of each and ``packed / shared``. The defaults are the demo's shape; the TRL
step benchmark's is ``--response-len 16``.

    python benchmarks/bench_shared_prefix.py [--prompt-len 7] [--response-len 4] [--threads 1]
    python benchmarks/bench_shared_prefix.py --shape smollm2 --prompts 2 --prompt-len 40 --response-len 20 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hybridflow.models import build_tiny_causal_lm
from hybridflow.parallel import VARLEN_SDPA, packed_log_probs, shared_prefix_log_probs

SHAPES = {
    "tiny": dict(vocab_size=20, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, intermediate_size=768),
    "smollm2": dict(
        vocab_size=49152, hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=7)
    parser.add_argument("--response-len", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one rank of two has one)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    shape = SHAPES[args.shape]
    model = build_tiny_causal_lm(**shape, max_position_embeddings=2048)
    model.set_attn_implementation(VARLEN_SDPA)
    vocab = shape["vocab_size"]
    rows = args.prompts * args.samples
    prompts = torch.randint(1, vocab, (args.prompts, args.prompt_len)).repeat_interleave(args.samples, dim=0)
    responses = torch.randint(1, vocab, (rows, args.response_len))
    prompt_mask, response_mask = torch.ones_like(prompts), torch.ones_like(responses)
    joined_ids, joined_mask = torch.cat([prompts, responses], 1), torch.cat([prompt_mask, response_mask], 1)

    def packed() -> torch.Tensor:
        return packed_log_probs(model, joined_ids, joined_mask).response(args.response_len).log_probs

    def shared() -> torch.Tensor:
        return shared_prefix_log_probs(model, prompts, prompt_mask, responses, response_mask).log_probs

    variants = {"packed": packed, "shared": shared}
    torch.testing.assert_close(shared(), packed(), atol=1e-4, rtol=0)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, forward in variants.items():
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            forward().sum().backward()
            seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    tokens = rows * (args.prompt_len + args.response_len)
    print(
        f"{args.shape} model, {rows} rows ({args.prompts} prompts x {args.samples}), {tokens} joined tokens, "
        f"{args.threads} thread(s)"
    )
    for name, value in medians.items():
        print(f"  {name:7s} {value:.4f} s (forward + backward, median of {args.rounds})")
    print(f"  packed / shared: {medians['packed'] / medians['shared']:.2f}x")


if __name__ == "__main__":
    main()
