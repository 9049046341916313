"""What vLLM's prefix caching saves on Re²'s continuations: the same continuation generation with the
engine's prefix caching on and off, and the ratio of the times.

Re²'s second stage asks, for every query, n prompts that share the query (each followed by its own
prefix) for m continuations each: m requests share "query + prefix", n x m share the query. vLLM shares
the KV cache of whole blocks only (128 tokens on the CPU build), so what it saves depends on how long
the shared parts are. Two workloads, both with a 3.2M-parameter Qwen2 (the arithmetic demo's shape) and
random weights, the prefixes random tokens (a prefix of a sample of length L cut as Re² cuts it: 0 with
probability 0.3, else a uniform ratio in [0, 0.8] of L):

- ``recipe``: the recipe's own task, questions of 6 tokens and samples of up to 40 (every prompt is
  shorter than one block);
- ``long``: questions of 256 tokens and samples of 384 (reasoning-length prefixes).

Each engine runs in its own process (one engine per process; the second setting's process starts after
the first ends). The prefix cache is emptied before every timed call, as a weight push empties it
before every generation of a training step, so only sharing within one call counts. The time is the
median of ``--repeats`` calls after one warm-up call.

Run (from the repository root):
    python benchmarks/bench_prefix_caching.py [--queries 2] [--n 8] [--m 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hybridflow.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from hybridflow.models import build_tiny_causal_lm, save_model_dir  # noqa: E402
from hybridflow.parallel.launch import run_ranks  # noqa: E402
from hybridflow.protocol import Batch  # noqa: E402
from hybridflow.rollout import EngineDerived, RolloutConfig, SamplingParams, build_rollout_engine  # noqa: E402
from recipes.re2.re2_prefixes import continuation_prompts, cut_lengths  # noqa: E402


@dataclass(frozen=True)
class Workload:
    """Continuation prompts of ``queries`` questions of ``question_len`` tokens, each with ``n`` prefixes
    cut from samples of ``sample_len`` tokens; ``m`` continuations of ``new_tokens`` tokens per prefix."""

    name: str
    queries: int
    question_len: int
    sample_len: int
    n: int
    m: int
    new_tokens: int

    def prompts(self, pad_token_id: int, vocab: int, seed: int = 0) -> Batch:
        generator = torch.Generator().manual_seed(seed)
        # Token ids past the 4 special ones: random text, the same in both settings.
        questions = torch.randint(4, vocab, (self.queries, self.question_len), generator=generator)
        samples = torch.randint(4, vocab, (self.queries * self.n, self.sample_len), generator=generator)
        cuts = cut_lengths(torch.full((len(samples),), self.sample_len), generator)
        rows = Batch(
            {
                "input_ids": questions.repeat_interleave(self.n, dim=0),
                "attention_mask": torch.ones(len(samples), self.question_len, dtype=torch.long),
            }
        )
        prefixes = [row[: int(k)].tolist() for row, k in zip(samples, cuts, strict=True)]
        return continuation_prompts(rows, prefixes, pad_token_id, prefix_width=self.sample_len)


WORKLOADS = {
    "recipe": lambda a: Workload("recipe", a.queries * 2, 6, 40, a.n, a.m, 40),
    "long": lambda a: Workload("long", a.queries, 256, 384, a.n, a.m, 32),
}


def timed_generation(
    rank: int, world_size: int, model_dir: Path, caching: bool, workloads: list, repeats: int
) -> dict:
    """In this process: one engine (prefix caching ``caching``), each workload's continuations timed."""
    tokenizer = build_char_tokenizer()
    config = RolloutConfig(
        engine="vllm",
        kv_cache_bytes=512 << 20,
        max_num_seqs=256,
        enforce_eager=True,
        cache_dir=str(REPO / ".cache" / "compile"),
        enable_prefix_caching=caching,
    )
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=1024))
    out: dict[str, Any] = {}
    for workload in workloads:
        prompts = workload.prompts(tokenizer.pad_token_id, len(tokenizer))
        sampling = SamplingParams(n=workload.m, temperature=1.0, max_new_tokens=workload.new_tokens, seed=0)
        seconds, tokens = [], 0
        for repeat in range(repeats + 1):
            engine.llm.reset_prefix_cache()
            start = time.perf_counter()
            rollouts = engine.generate(prompts, sampling)
            if repeat:  # the first call warms up
                seconds.append(time.perf_counter() - start)
            tokens = int(rollouts["response_lengths"].sum())
        out[workload.name] = {
            "seconds": statistics.median(seconds),
            "prompt_tokens": int(prompts["attention_mask"].sum()) * workload.m,
            "generated_tokens": tokens,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=2, help="queries of the long workload (recipe: twice)")
    parser.add_argument("--n", type=int, default=8, help="prefixes per query")
    parser.add_argument("--m", type=int, default=8, help="continuations per prefix")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workloads = [make(args) for make in WORKLOADS.values()]
    with tempfile.TemporaryDirectory(prefix="bench-prefix-caching-") as scratch:
        tokenizer = build_char_tokenizer()
        model = build_tiny_causal_lm(
            len(tokenizer),
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=768,
            max_position_embeddings=1024,
        )
        model_dir = save_model_dir(model, tokenizer, Path(scratch) / "model")
        results = {
            caching: run_ranks(
                timed_generation, 1, model_dir, caching, workloads, args.repeats, timeout_s=1200
            )[0]
            for caching in (False, True)
        }
    print(
        f"{'workload':>9} {'rows':>5} {'prompt tok':>10} {'new tok':>8} "
        f"{'no cache s':>10} {'cache s':>8} {'speed-up':>8}"
    )
    for workload in workloads:
        off, on = results[False][workload.name], results[True][workload.name]
        rows = workload.queries * workload.n * workload.m
        print(
            f"{workload.name:>9} {rows:>5} {off['prompt_tokens']:>10} {off['generated_tokens']:>8} "
            f"{off['seconds']:>10.2f} {on['seconds']:>8.2f} {off['seconds'] / on['seconds']:>7.2f}x"
        )


if __name__ == "__main__":
    main()
