"""Gathering the full weights of an FSDP2 model, without an engine: `WeightStreamer` against two baselines.

Two ranks in a gloo group (spawned processes, one thread each) hold an FSDP2 shard of a random Qwen2
(by default the 23.6M-parameter policy of ``bench_resharding.py``). Each method drains every full
tensor once, in ``state_dict`` order:

- **streamer**: `WeightStreamer.stream` (all-gather into slots of one reused buffer of ``--bucket-mb``);
- **iter_full_state**: a fresh ``DTensor.full_tensor()`` per parameter;
- **state_dict**: ``get_model_state_dict(full_state_dict=True)``, the whole model at once.

Methods alternate within each round; the table shows the median seconds over ``--repeats`` rounds
(slower rank) and each baseline's time over the streamer's.

Run:  python benchmarks/bench_weight_gather.py [--repeats 5] [--bucket-mb 16] [--hidden 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.parallel.launch import run_ranks

METHODS = ("streamer", "iter_full_state", "state_dict")


def _rank_job(rank: int, world: int, opts: dict[str, Any]) -> dict[str, list[float]]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridflow.parallel import build_meshes, iter_full_state, shard_model
    from hybridflow.resharding.streaming import WeightStreamer

    torch.set_num_threads(1)
    config = Qwen2Config(
        vocab_size=32,
        hidden_size=opts["hidden"],
        intermediate_size=opts["intermediate"],
        num_hidden_layers=opts["layers"],
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = shard_model(Qwen2ForCausalLM(config), build_meshes(world, tp_size=1).train)
    streamer = WeightStreamer(opts["bucket_mb"] << 20, torch.device("cpu"))
    drains = {
        "streamer": lambda: sum(1 for _ in streamer.stream(model)),
        "iter_full_state": lambda: sum(1 for _ in iter_full_state(model)),
        "state_dict": lambda: len(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))),
    }
    seconds: dict[str, list[float]] = {name: [] for name in METHODS}
    for round_index in range(opts["repeats"] + 1):  # round 0 warms up
        order = METHODS[round_index % len(METHODS) :] + METHODS[: round_index % len(METHODS)]
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            drains[name]()
            if round_index:
                seconds[name].append(time.perf_counter() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=1408)
    args = parser.parse_args()
    per_rank = run_ranks(_rank_job, 2, vars(args))
    medians = {
        name: statistics.median(max(times) for times in zip(*(r[name] for r in per_rank), strict=True))
        for name in METHODS
    }
    print(f"{'method':16} {'median s':>9} {'/ streamer':>11}")
    for name in METHODS:
        print(f"{name:16} {medians[name]:9.3f} {medians[name] / medians['streamer']:10.2f}x")


if __name__ == "__main__":
    main()
