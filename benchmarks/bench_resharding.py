"""The train -> inference -> train switch: `ReshardingManager` against a naive full-state-dict push.

Two ranks in a gloo group (spawned processes, no Ray) each hold an FSDP2 shard of a random Qwen2 of
about 25M parameters (fp32) and a vLLM engine (``--tp 2``: one engine, tensor-parallel over both ranks;
``--tp 1``: one independent engine per rank). Each switch is measured on every rank:

- **ours** (one row per ``--bucket-mb``): ``ReshardingManager.to_inference()`` (resume the KV cache,
  stream the FSDP2 parameters in buckets into ``engine.update_weights``), a greedy ``generate``, then
  ``to_training()`` (free the KV cache);
- **naive**: ``engine.resume()``, gather the FULL state dict on every rank
  (``get_model_state_dict(full_state_dict=True)``, or with ``--naive-gather iter`` a dict built from
  ``iter_full_state``), one ``update_weights(state.items())`` call, drop the dict and
  ``return_freed_host_memory()``; the same greedy ``generate``; then ``engine.release()``;
- with ``--breakdown``, at the first bucket size, the parts of a bucketed push of fresh tensors
  (the manager's previous implementation): the streaming without the per-bucket ``malloc_trim``,
  the gather alone (buckets dropped, engine not loaded), and the engine load alone (from weights
  gathered before the measurement starts).

Both sides are measured the same way: wall time of each half, RSS (`PeakMemoryTracker`, a 2 ms
sampler plus samples where memory is known to peak) and minor page faults (``getrusage``) of the
train -> inference half. "Stream extra" is how far RSS rose during the weight transfer above its
level just before it (the manager's ``stream_extra_peak_bytes``; for the other rows one tracker
restarted the same way around gather + load + free); "switch extra" is the same for the whole train -> inference half (it also
includes restoring the KV cache, identical on both sides).

The FSDP2 weights alternate between two versions A and B from switch to switch, so every push
changes what the engine holds. After each switch the engine generates greedily from fixed prompts;
the tokens of a version must be the same under every method (equal work), and A and B should differ
(the push took effect). One warm-up switch per method comes first and is not counted; then rounds
of all methods, each round starting one method later. Times are the slower rank of each switch,
memory the larger rank; the tables show medians over the rounds (and the fastest switch).
Results and their reading: docs/benchmarks_resharding.md.

Run:  python benchmarks/bench_resharding.py [--tp 2 1] [--bucket-mb 16 4 64] [--repeats 7] [--breakdown]
      [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.parallel.launch import run_ranks

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = REPO_ROOT / ".cache"
ALPHABET = "0123456789+-*=()abcdefghij"
PROMPT_TEXTS = ("12+7=", "3*(4-1)=", "abc", "ab+cd*9=")
MIB = 2**20


# ---------------------------------------------------------------------------------------- one rank


def _prompts():
    from hybridflow.data.char_tokenizer import build_char_tokenizer
    from hybridflow.protocol import Batch

    encoded = build_char_tokenizer(ALPHABET)(list(PROMPT_TEXTS), padding=True, return_tensors="pt")
    return Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def _tokens(rollouts) -> list[list[int]]:
    lengths = rollouts["response_lengths"]
    return [row[:n].tolist() for row, n in zip(rollouts["responses"], lengths, strict=True)]


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _rank_job(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from hybridflow.models.io import load_causal_lm
    from hybridflow.parallel import build_meshes, iter_full_state, reshard_all, shard_model
    from hybridflow.parallel.weights import iter_buckets, tensor_bytes
    from hybridflow.resharding.manager import ReshardingConfig, ReshardingManager
    from hybridflow.resharding.memory import (
        PeakMemoryTracker,
        current_memory_bytes,
        return_freed_host_memory,
    )
    from hybridflow.rollout import EngineDerived, RolloutConfig, SamplingParams, build_rollout_engine

    cpu = torch.device("cpu")
    tp = opts["tp"]
    model_dir = opts["model_dir"]
    meshes = build_meshes(world, tp, device_type="cpu")
    model = shard_model(load_causal_lm(model_dir).to(cpu), meshes.train)
    model.requires_grad_(False)
    reshard_all(model)

    # Two weight versions of this rank's shards; switch k loads version k % 2 before streaming.
    params = list(model.parameters())
    version_a = [p.to_local().detach().clone() for p in params]
    noise = torch.Generator().manual_seed(1000 + rank)
    version_b = [v + opts["perturb"] * torch.randn(v.shape, generator=noise) for v in version_a]

    def load_version(version: int) -> None:
        with torch.no_grad():
            for p, v in zip(params, version_b if version else version_a, strict=True):
                p.to_local().copy_(v)

    start = time.perf_counter()
    engine = build_rollout_engine(
        RolloutConfig(
            engine="vllm",
            tp_size=tp,
            cache_dir=str(CACHE_DIR),
            kv_cache_bytes=opts["kv_cache_mb"] * MIB,
            max_num_seqs=16,
            enforce_eager=opts["enforce_eager"],
        ),
        model_dir,
        EngineDerived(max_model_len=128),
    )
    engine_init_s = time.perf_counter() - start
    engine.release()  # start in the training layout, as the actor worker does
    managers = {
        mb: ReshardingManager(model, engine, None, ReshardingConfig(bucket_bytes=mb * MIB), cpu)
        for mb in opts["bucket_mb"]
    }
    prompts = _prompts()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=opts["new_tokens"])

    def ours(bucket_mb: int) -> dict[str, Any]:
        manager = managers[bucket_mb]
        faults = _minor_faults()
        to_inf = manager.to_inference()
        faults = _minor_faults() - faults
        start = time.perf_counter()
        tokens = _tokens(engine.generate(prompts, greedy))
        generate_s = time.perf_counter() - start
        to_train = manager.to_training()
        return {
            "to_inference_s": to_inf.seconds,
            "to_training_s": to_train.seconds,
            "generate_s": generate_s,
            "streamed_bytes": to_inf.bytes_streamed,
            "gather_buffers": to_inf.gather_buffers,
            "retired_buffers": to_inf.retired_buffers,
            "stream_extra_peak_bytes": to_inf.stream_extra_peak_bytes,
            "switch_extra_peak_bytes": to_inf.extra_peak_bytes,
            "page_faults": faults,
            "tokens": tokens,
        }

    def gather_full_state() -> dict[str, torch.Tensor]:
        if opts["naive_gather"] == "iter":
            return dict(iter_full_state(model))
        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))

    def measured(push: Callable[[PeakMemoryTracker], dict[str, Any]]) -> dict[str, Any]:
        """A train -> inference -> train cycle around ``push``, measured as the manager measures."""
        faults = _minor_faults()
        start = time.perf_counter()
        with PeakMemoryTracker(cpu) as tracker:
            engine.resume()
            switch_start = tracker.start_bytes
            before_stream_peak = tracker.restart()
            extra = push(tracker)
            tracker.sample()
            stream_extra = tracker.extra_peak_bytes
        switch_extra = max(before_stream_peak, tracker.peak_bytes) - switch_start
        to_inference_s = time.perf_counter() - start
        faults = _minor_faults() - faults
        start = time.perf_counter()
        tokens = _tokens(engine.generate(prompts, greedy))
        generate_s = time.perf_counter() - start
        start = time.perf_counter()
        with PeakMemoryTracker(cpu):
            engine.release()
        return {
            "to_inference_s": to_inference_s,
            "to_training_s": time.perf_counter() - start,
            "generate_s": generate_s,
            "stream_extra_peak_bytes": stream_extra,
            "switch_extra_peak_bytes": switch_extra,
            "page_faults": faults,
            "tokens": tokens,
            **extra,
        }

    def naive(stream: PeakMemoryTracker) -> dict[str, Any]:
        gather_start = time.perf_counter()
        state = gather_full_state()
        stream.sample()  # the whole model is gathered: the naive peak
        gather_s = time.perf_counter() - gather_start
        streamed = sum(tensor_bytes(t) for t in state.values())
        load_start = time.perf_counter()
        engine.update_weights(state.items())
        stream.sample()
        load_s = time.perf_counter() - load_start
        del state
        return_freed_host_memory()
        return {
            "streamed_bytes": streamed,
            "largest_bucket_bytes": streamed,
            "gather_s": gather_s,
            "load_s": load_s,
        }

    # --breakdown: the parts of ours, one at a time, at the first bucket size.
    bucket = opts["bucket_mb"][0] * MIB

    def buckets(
        weights: Iterable[tuple[str, torch.Tensor]], trim: bool
    ) -> Iterator[tuple[str, torch.Tensor]]:
        for part in iter_buckets(weights, bucket):
            yield from part
            part.clear()
            if trim:
                return_freed_host_memory()

    def stream_without_trims(stream: PeakMemoryTracker) -> dict[str, Any]:
        engine.update_weights(buckets(iter_full_state(model), trim=False))
        stream.sample()
        return_freed_host_memory()
        return {"streamed_bytes": full_bytes}

    def gather_only(stream: PeakMemoryTracker) -> dict[str, Any]:
        streamed = 0
        for part in iter_buckets(iter_full_state(model), bucket):
            streamed += sum(tensor_bytes(t) for _, t in part)
            stream.sample()
            part.clear()
            return_freed_host_memory()
        return {"streamed_bytes": streamed}

    full_bytes = sum(p.numel() * p.element_size() for p in params)
    pre_gathered: dict[str, torch.Tensor] = {}

    def engine_only(stream: PeakMemoryTracker) -> dict[str, Any]:
        engine.update_weights(buckets(iter(pre_gathered.items()), trim=True))
        return {"streamed_bytes": full_bytes}

    def run(method: str) -> dict[str, Any]:
        if method.startswith("ours@"):
            return ours(int(method.removeprefix("ours@")))
        if method == "naive":
            return measured(naive)
        if method.endswith("no-trim"):
            return measured(stream_without_trims)
        if method.startswith("gather-only"):
            return {**measured(gather_only), "loads_weights": False}
        # engine-only: the full weights are gathered before the measurement starts.
        pre_gathered.update(iter_full_state(model))
        try:
            return measured(engine_only)
        finally:
            pre_gathered.clear()
            return_freed_host_memory()

    # Warm-up: one of each; then rounds of all methods, each round starting one method later.
    methods = [f"ours@{mb}" for mb in opts["bucket_mb"]] + ["naive"]
    if opts["breakdown"]:
        first = opts["bucket_mb"][0]
        methods += [f"stream@{first}-no-trim", f"gather-only@{first}", f"engine-only@{first}"]
    schedule = list(methods)
    for r in range(opts["repeats"]):
        shift = r % len(methods)
        schedule += methods[shift:] + methods[:shift]
    records = []
    for k, method in enumerate(schedule):
        version = k % 2
        load_version(version)
        dist.barrier()
        rss_before = current_memory_bytes(cpu)
        record = run(method)
        return_freed_host_memory()
        record.update(
            method=method,
            version="AB"[version],
            warmup=k < len(methods),
            rss_before=rss_before,
            rss_after=current_memory_bytes(cpu),
        )
        records.append(record)
    return {
        "rank": rank,
        "engine_init_s": engine_init_s,
        "params": sum(p.numel() for p in params),
        "records": records,
    }




# ---------------------------------------------------------------------------------------- report


def write_policy(path: Path, args: argparse.Namespace) -> Path:
    from hybridflow.data.char_tokenizer import build_char_tokenizer
    from hybridflow.models import build_tiny_causal_lm, save_model_dir

    tokenizer = build_char_tokenizer(ALPHABET)
    model = build_tiny_causal_lm(
        len(tokenizer),
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        num_kv_heads=args.hidden // 128,
        intermediate_size=args.intermediate,
        seed=5,
    )
    return save_model_dir(model, tokenizer, path)


def merge_ranks(per_rank: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per switch: the slower rank's times, the larger rank's memory, every rank's tokens."""
    merged = []
    for records in zip(*(r["records"] for r in per_rank), strict=True):
        first = records[0]
        # Sizes are the same on every rank; the rest is merged below.
        keys = ("method", "version", "warmup", "streamed_bytes", "largest_bucket_bytes", "gather_buffers")
        row = {key: first[key] for key in keys if key in first}
        for key in first:
            if key not in row and key.endswith(("_s", "_bytes", "_faults")):
                row[key] = max(r[key] for r in records)
        row["retired_buffers"] = max(r.get("retired_buffers", 0) for r in records)
        row["leak_bytes"] = max(r["rss_after"] - r["rss_before"] for r in records)
        row["tokens"] = [r["tokens"] for r in records]
        row["loads_weights"] = first.get("loads_weights", True)
        merged.append(row)
    return merged


def summarize(rows: list[dict[str, Any]], method: str) -> dict[str, float]:
    measured = [r for r in rows if r["method"] == method and not r["warmup"]]
    keys = [k for k in measured[0] if k.endswith(("_s", "_bytes", "_faults"))]
    out = {key: statistics.median(r[key] for r in measured) for key in keys}
    switch_s = [r["to_inference_s"] + r["to_training_s"] for r in measured]
    out["switch_s"] = statistics.median(switch_s)
    out["min_switch_s"] = min(switch_s)  # the least disturbed by other load on the machine
    return out


def check_tokens(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Greedy tokens per version must agree across methods, switches and (within a TP group) ranks."""
    by_version: dict[str, set[str]] = {"A": set(), "B": set()}
    methods_seen: dict[str, set[str]] = {"A": set(), "B": set()}
    for row in rows:
        if not row["loads_weights"]:
            continue
        methods_seen[row["version"]].add(row["method"])
        # tp=1: every rank is its own engine on the same weights; tp=2: both ranks are one engine.
        for tokens in row["tokens"]:
            by_version[row["version"]].add(json.dumps(tokens))
    same = all(len(v) == 1 for v in by_version.values())
    distinct = same and by_version["A"] != by_version["B"]
    return {
        "tokens_match": same,
        "methods_per_version": {v: sorted(m) for v, m in methods_seen.items()},
        "versions_differ": distinct,
        "sample_A": json.loads(next(iter(by_version["A"])))[0] if by_version["A"] else None,
        "sample_B": json.loads(next(iter(by_version["B"])))[0] if by_version["B"] else None,
    }


def print_table(tp: int, summaries: dict[str, dict[str, float]], checks: dict[str, Any]) -> None:
    naive = summaries["naive"]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "n/a"

    print(f"\n== tp={tp}: medians; times of the slower rank, memory of the larger rank ==")
    print(
        f"{'method':18} {'to_inf s':>8} {'to_train s':>10} {'switch s':>8} {'min s':>6} {'streamed MiB':>12} "
        f"{'stream extra MiB':>16} {'switch extra MiB':>16} {'page faults':>11} {'generate s':>10}"
    )
    for name, s in summaries.items():
        print(
            f"{name:18} {s['to_inference_s']:8.3f} {s['to_training_s']:10.3f} {s['switch_s']:8.3f} "
            f"{s['min_switch_s']:6.3f} {s['streamed_bytes'] / MIB:12.1f} {s['stream_extra_peak_bytes'] / MIB:16.1f} "
            f"{s['switch_extra_peak_bytes'] / MIB:16.1f} {s['page_faults']:11.0f} {s['generate_s']:10.3f}"
        )
    print(f"naive split: gather {naive['gather_s']:.3f} s + update_weights {naive['load_s']:.3f} s")
    for name, s in summaries.items():
        if not name.startswith("ours@"):
            continue
        bucket = int(name.removeprefix("ours@")) * MIB
        print(
            f"{name} / naive: switch time {ratio(s['switch_s'], naive['switch_s'])}x "
            f"(min {ratio(s['min_switch_s'], naive['min_switch_s'])}x), "
            f"stream extra peak {ratio(s['stream_extra_peak_bytes'], naive['stream_extra_peak_bytes'])}x, "
            f"switch extra peak {ratio(s['switch_extra_peak_bytes'], naive['switch_extra_peak_bytes'])}x;  "
            f"goal extra <= one bucket: {s['stream_extra_peak_bytes'] <= bucket} "
            f"({s['stream_extra_peak_bytes'] / bucket:.2f} buckets), time <= naive: {s['switch_s'] <= naive['switch_s']}"
        )
    print(
        f"greedy tokens identical for the same weights under every method: {checks['tokens_match']} "
        f"(methods per version: {checks['methods_per_version']}); "
        f"versions A and B give different tokens: {checks['versions_differ']}"
    )


def main() -> int:
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # inherited by the spawned ranks
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tp", type=int, nargs="+", default=[2], choices=[1, 2], help="engine TP sizes to run"
    )
    parser.add_argument("--bucket-mb", type=int, nargs="+", default=[16], help="bucket sizes of ours (MiB)")
    parser.add_argument(
        "--repeats", type=int, default=5, help="measured switches per method (after 1 warm-up)"
    )
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--intermediate", type=int, default=1408)
    parser.add_argument("--kv-cache-mb", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--perturb", type=float, default=0.02, help="std of version B's offset from A")
    parser.add_argument("--naive-gather", choices=["state_dict", "iter"], default="state_dict")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the parts of ours at the first bucket size: streaming without the per-bucket "
        "malloc_trim, the gather alone, the engine load alone (from weights gathered beforehand)",
    )
    parser.add_argument("--enforce-eager", action="store_true", help="skip vLLM's torch.compile")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--json", type=Path, help="also write every switch's numbers here")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="hf-bench-reshard-", dir="/tmp"))
    failed = False
    dump: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "runs": {}}
    try:
        model_dir = write_policy(workdir / "policy", args)
        for tp in args.tp:
            opts = {
                "tp": tp,
                "model_dir": str(model_dir),
                "bucket_mb": args.bucket_mb,
                "repeats": args.repeats,
                "kv_cache_mb": args.kv_cache_mb,
                "new_tokens": args.new_tokens,
                "perturb": args.perturb,
                "naive_gather": args.naive_gather,
                "enforce_eager": args.enforce_eager,
                "breakdown": args.breakdown,
            }
            start = time.perf_counter()
            per_rank = run_ranks(_rank_job, 2, opts, timeout_s=args.timeout_s)
            rows = merge_ranks(per_rank)
            summaries = {m: summarize(rows, m) for m in dict.fromkeys(r["method"] for r in rows)}
            checks = check_tokens(rows)
            params = per_rank[0]["params"]
            print(
                f"\npolicy: Qwen2 {params / 1e6:.1f}M params fp32 ({params * 4 / MIB:.0f} MiB), 2 gloo ranks, "
                f"vLLM tp={tp}, engine init {max(r['engine_init_s'] for r in per_rank):.1f} s, "
                f"run {time.perf_counter() - start:.0f} s, naive gather: {args.naive_gather}"
            )
            print_table(tp, summaries, checks)
            print("per switch: method, weights version, switch s, stream extra MiB, RSS after - before MiB")
            for row in rows:
                print(
                    f"  {row['method']:18} {row['version']}{' warm-up' if row['warmup'] else '':8} "
                    f"{row['to_inference_s'] + row['to_training_s']:6.3f} s "
                    f"{row['stream_extra_peak_bytes'] / MIB:7.1f} {row['leak_bytes'] / MIB:7.1f}"
                )
            failed |= not checks["tokens_match"]
            dump["runs"][f"tp{tp}"] = {
                "params": params,
                "summaries": summaries,
                "checks": checks,
                "switches": [{k: v for k, v in r.items() if k != "tokens"} for r in rows],
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(dump, indent=2))
    if failed:
        print("FAILED: greedy tokens differ between methods for the same weights", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
