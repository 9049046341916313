"""What each rank of the vLLM engine tests runs: one engine, several checks, numbers back to pytest.

Starting an engine costs 5-25 s on CPU, so one job per TP size runs every check on one engine and the
tests assert on the returned numbers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch

from hybridflow.models import load_causal_lm
from hybridflow.protocol import Batch
from hybridflow.rollout import (
    EngineDerived,
    HFRolloutEngine,
    RolloutConfig,
    SamplingParams,
    build_rollout_engine,
    response_log_probs,
)
from tests.rollout import _tiny

KV_CACHE_BYTES = 64 << 20
GREEDY = SamplingParams(temperature=0, max_new_tokens=16)
PLAIN = SamplingParams(n=4, temperature=0.8, max_new_tokens=16)
FILTERED = SamplingParams(n=4, temperature=0.7, top_k=8, top_p=0.9, max_new_tokens=16, seed=11)
MANY = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, seed=3)
AFTER_PUSH = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=5)


def _tokens(batch: Batch) -> list[list[int]]:
    return [row[:n].tolist() for row, n in zip(batch["responses"], batch["response_lengths"], strict=True)]


def _abs_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    diff = (a - b).abs()[mask.bool()]
    return {"mean": float(diff.mean()), "max": float(diff.max())}


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _kv_bytes_allocated(engine: Any) -> int:
    """Bytes behind the worker's KV cache tensors, each storage counted once (layers share one)."""

    def allocated(worker: Any) -> int:
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage() for t in worker.model_runner.kv_caches
        }
        return sum(storage.nbytes() for storage in storages.values())

    return int(engine.llm.collective_rpc(allocated)[0])


def _shm_segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if "cpushm" in name}


def engine_checks(rank: int, world_size: int, tp: int, model_dir: Path) -> dict[str, Any]:
    os.environ["VLLM_LOGGING_LEVEL"] = "WARNING"
    results: dict[str, Any] = {}
    prompts = _tiny.prompts()
    model = load_causal_lm(model_dir)
    reference = HFRolloutEngine(load_causal_lm(model_dir), eos_token_ids=(2,), pad_token_id=0)

    segments_before = _shm_segments()
    start = time.perf_counter()
    config = RolloutConfig(
        engine="vllm",
        tp_size=tp,
        kv_cache_bytes=KV_CACHE_BYTES,
        max_num_seqs=32,
        # As small as allowed, so that one generate call needs several prefill steps.
        max_num_batched_tokens=128,
        enforce_eager=True,
        cache_dir=str(_tiny.CACHE_DIR),
    )
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=128))
    results["init_s"] = time.perf_counter() - start
    # vLLM names its CPU shared memory after VLLM_DIST_IDENT; other jobs may add segments meanwhile,
    # so only this job's identifier is looked for.
    results["dist_ident"] = os.environ["VLLM_DIST_IDENT"]
    results["shm_segments_left"] = sorted(
        name for name in _shm_segments() - segments_before if name.startswith(results["dist_ident"])
    )

    start = time.perf_counter()
    greedy = engine.generate(prompts, GREEDY)
    results["first_generate_s"] = time.perf_counter() - start
    results["greedy"] = _tokens(greedy)
    results["greedy_hf"] = _tokens(reference.generate(prompts, GREEDY))
    results["greedy_finish"] = greedy["finish_reason"].tolist()

    for name, sampling in (("plain", PLAIN), ("filtered", FILTERED)):
        out = engine.generate(prompts, sampling)
        results[f"{name}_tokens"] = _tokens(out)
        results[f"{name}_uid"] = out["uid"].tolist()
        results[f"{name}_finish"] = out["finish_reason"].tolist()
        results[f"{name}_lp"] = _abs_diff(
            out["rollout_log_probs"], response_log_probs(model, out, sampling), out["response_mask"]
        )

    # An explicit seed reproduces this engine's own samples (other dp engines derive other seeds).
    results["filtered_again"] = _tokens(engine.generate(prompts, FILTERED))

    # 64 seeded samples: their prompts take several scheduler steps to prefill. A sample depends on
    # its own request's seed only, so the first prompts sample alike in a small and a large call.
    many = Batch.concat([prompts] * 4)
    large = engine.generate(many, MANY)
    results["many_lp"] = _abs_diff(
        large["rollout_log_probs"], response_log_probs(model, large, MANY), large["response_mask"]
    )
    results["many_first_tokens"] = _tokens(large)[: len(prompts) * MANY.n]
    results["few_tokens"] = _tokens(engine.generate(prompts, MANY))

    new_state = _tiny.perturbed_state(model)
    consumed: list[str] = []

    def stream() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in new_state.items():
            consumed.append(name)
            yield name, tensor

    start = time.perf_counter()
    engine.update_weights(stream())
    results["update_s"] = time.perf_counter() - start
    results["streamed"] = (len(consumed), len(new_state))
    pushed = engine.generate(prompts, AFTER_PUSH)
    new_model = load_causal_lm(model_dir)
    new_model.load_state_dict(new_state)
    results["pushed_lp_new"] = _abs_diff(
        pushed["rollout_log_probs"],
        response_log_probs(new_model, pushed, AFTER_PUSH),
        pushed["response_mask"],
    )
    results["pushed_lp_stale"] = _abs_diff(
        pushed["rollout_log_probs"], response_log_probs(model, pushed, AFTER_PUSH), pushed["response_mask"]
    )
    greedy_new = _tokens(engine.generate(prompts, GREEDY))
    reference.update_weights(new_state.items())
    results["greedy_new"] = greedy_new
    results["greedy_new_hf"] = _tokens(reference.generate(prompts, GREEDY))

    # First cycle: the freshly restored storage is zero-filled, so every page is resident and the
    # second release shows its full size in the process's resident memory.
    results["kv_allocated"] = _kv_bytes_allocated(engine)
    results["freed"] = engine.release()
    results["kv_allocated_released"] = _kv_bytes_allocated(engine)
    try:
        engine.generate(prompts, GREEDY)
        results["generate_while_released"] = "ran"
    except RuntimeError as error:
        results["generate_while_released"] = str(error)
    results["restored"] = engine.resume()
    rss_before = _rss()
    start = time.perf_counter()
    engine.release()
    results["release_s"] = time.perf_counter() - start
    results["rss_drop"] = rss_before - _rss()
    start = time.perf_counter()
    engine.resume()
    results["resume_s"] = time.perf_counter() - start
    results["greedy_after_resume"] = _tokens(engine.generate(prompts, GREEDY))
    return results
