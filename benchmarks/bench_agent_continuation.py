"""Per-turn cost of continuing multi-turn episodes from their token prefixes, against re-encoding the
whole history every turn.

Each of ``--episodes`` episodes grows turn by turn as `hybridflow.agents.run_episodes` grows it: the
engine samples up to ``--new-tokens`` ids after the episode's exact ids
(`RolloutEngine.continue_token_lists`), then an observation of ``--observation`` ids (random, the same
in every run) is appended. The time of each turn's engine call is recorded with the history length it
continued. Engines, each in a process of its own:

- ``vllm-cache``: vLLM with prefix caching (the default): the blocks of an episode's earlier turns are
  served from the cache, so a turn computes its new ids (and the last, partial block) only;
- ``vllm-nocache``: the same engine with prefix caching off: every turn re-encodes the whole history;
- ``hf-kept``: the HF engine keeping each sample's KV cache between calls (its default): a turn
  prefills the ids added since the episode's last turn;
- ``hf-whole``: the HF engine with ``kept_cache_bytes=0``: every turn prefills the whole history.

The model is the arithmetic demo's shape (Qwen2, hidden 256, 4 layers, 3.2M parameters, random
weights), fp32, torch on one thread (as vLLM's CPU worker runs it). Each engine call is timed in CPU
seconds of the process (robust to other jobs on a shared host) and in wall seconds; a turn's figure is
the median over ``--repeats`` runs of the whole episode set, after a warm-up run of two turns.

Run (from the repository root):
    python benchmarks/bench_agent_continuation.py [--episodes 8] [--turns 12] [--observation 96]
        [--new-tokens 32] [--repeats 2] [--engines vllm-cache vllm-nocache hf-kept hf-whole]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hybridflow.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from hybridflow.models import build_tiny_causal_lm, save_model_dir  # noqa: E402
from hybridflow.parallel.launch import run_ranks  # noqa: E402
from hybridflow.rollout import EngineDerived, RolloutConfig, SamplingParams, build_rollout_engine  # noqa: E402

ENGINES = ("vllm-cache", "vllm-nocache", "hf-kept", "hf-whole")
MAX_MODEL_LEN = 4096


def _episode_turns(engine: Any, args: argparse.Namespace, vocab: int, seed: int) -> list[dict[str, float]]:
    """One run of the episode set: per turn, the call's seconds, mean history and mean new ids.

    Each run draws its own prompts and observations (``seed``), so no run finds another's ids cached.
    """
    generator = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(4, vocab, (args.observation,), generator=generator).tolist()
        for _ in range(args.episodes)
    ]
    histories = [list(p) for p in prompts]
    previous = [len(h) for h in histories]
    turns = []
    for turn in range(args.turns):
        sampling = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=seed * 1000 + turn)
        began, began_cpu = time.perf_counter(), time.process_time()
        samples = engine.continue_token_lists(histories, sampling)
        seconds, cpu_seconds = time.perf_counter() - began, time.process_time() - began_cpu
        turns.append(
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "history": statistics.mean(len(h) for h in histories),
                "new": statistics.mean(len(h) - p for h, p in zip(histories, previous, strict=True)),
            }
        )
        previous = [len(h) for h in histories]
        for history, sample in zip(histories, samples, strict=True):
            history += list(sample.token_ids)
            history += torch.randint(4, vocab, (args.observation,), generator=generator).tolist()
    return turns


def timed_episodes(
    rank: int, world_size: int, model_dir: Path, engine_name: str, args: argparse.Namespace
) -> list:
    """In this process: build the engine ``engine_name`` names and time ``args.repeats`` runs."""
    config = RolloutConfig(
        engine="hf" if engine_name.startswith("hf") else "vllm",
        kv_cache_bytes=1 << 30,
        max_num_seqs=64,
        max_num_batched_tokens=args.episodes * MAX_MODEL_LEN,
        enforce_eager=True,
        cache_dir=str(REPO / ".cache" / "compile"),
        enable_prefix_caching=engine_name == "vllm-cache",
    )
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=MAX_MODEL_LEN))
    # vLLM's CPU worker runs torch on one thread; the HF engine does the same here, so both columns
    # are one thread's work.
    torch.set_num_threads(1)
    if engine_name == "hf-whole":
        engine.kept_cache_bytes = 0
    vocab = len(build_char_tokenizer())
    _episode_turns(
        engine, argparse.Namespace(**{**vars(args), "turns": 2}), vocab, seed=args.repeats
    )  # warm-up
    return [_episode_turns(engine, args, vocab, seed=repeat) for repeat in range(args.repeats)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument(
        "--observation", type=int, default=96, help="ids inserted after every turn (and the prompt's)"
    )
    parser.add_argument("--new-tokens", type=int, default=32, help="most ids sampled per turn")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    args = parser.parse_args()
    needed = (args.turns + 1) * (args.observation + args.new_tokens)
    if needed > MAX_MODEL_LEN:
        parser.error(
            f"--turns x (--observation + --new-tokens) reaches {needed} ids, more than {MAX_MODEL_LEN}"
        )
    with tempfile.TemporaryDirectory(prefix="bench-agent-continuation-") as scratch:
        tokenizer = build_char_tokenizer()
        model = build_tiny_causal_lm(
            len(tokenizer),
            hidden_size=256,
            num_layers=4,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=768,
            max_position_embeddings=MAX_MODEL_LEN,
        )
        model_dir = save_model_dir(model, tokenizer, Path(scratch) / "model")
        runs = {
            name: run_ranks(timed_episodes, 1, model_dir, name, args, timeout_s=1800)[0]
            for name in args.engines
        }
    for measure, label in (("cpu_seconds", "CPU ms"), ("seconds", "wall ms")):
        print(f"\nper-turn {label} of the engine call (median over the runs):")
        print(f"{'turn':>4} {'history':>8} {'new ids':>8}" + "".join(f" {name:>13}" for name in args.engines))
        for turn in range(args.turns):
            first = runs[args.engines[0]][0][turn]
            cells = "".join(
                f" {1000 * statistics.median(run[turn][measure] for run in runs[name]):>13.1f}"
                for name in args.engines
            )
            print(f"{turn:>4} {first['history']:>8.0f} {first['new']:>8.0f}{cells}")
        half = args.turns // 2
        print(f"mean {label} per turn, first half -> second half of the turns (growth):")
        for name in args.engines:
            per_turn = [statistics.median(run[t][measure] for run in runs[name]) for t in range(args.turns)]
            early, late = statistics.mean(per_turn[: max(1, half)]), statistics.mean(per_turn[half:])
            print(f"  {name:>13}: {1000 * early:8.1f} -> {1000 * late:8.1f}  ({late / early:.2f}x)")


if __name__ == "__main__":
    main()
