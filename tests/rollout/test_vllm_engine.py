"""The vLLM engine in SPMD mode inside a gloo world of 2 processes: tp=1 (two engines) and tp=2 (one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridflow.parallel.launch import run_ranks
from tests.rollout import _vllm_job

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow

EOS = 2


@pytest.fixture(scope="module", params=[1, 2], ids=["tp1", "tp2"])
def ranks(request: pytest.FixtureRequest, tiny_model_dir: Path) -> tuple[int, list[dict[str, Any]]]:
    """``(tp, [rank 0 results, rank 1 results])`` of ``_vllm_job.engine_checks``."""
    tp = request.param
    return tp, run_ranks(_vllm_job.engine_checks, 2, tp, tiny_model_dir, timeout_s=400)


def test_greedy_tokens_equal_the_hf_engine(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    for result in results:
        assert result["greedy"] == result["greedy_hf"]
        for tokens, reason in zip(result["greedy"], result["greedy_finish"], strict=True):
            assert reason == ("stop" if tokens[-1] == EOS else "length")
            assert reason == "stop" or len(tokens) == _vllm_job.GREEDY.max_new_tokens


def test_log_probs_match_training_side_recomputation(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    for result in results:
        for name in ("plain", "filtered"):
            assert result[f"{name}_lp"]["mean"] < 1e-3, (name, result[f"{name}_lp"])
            assert result[f"{name}_lp"]["max"] < 1e-2, (name, result[f"{name}_lp"])


def test_large_seeded_call_prefills_over_several_steps(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    for result in results:
        assert result["many_lp"]["mean"] < 1e-3, result["many_lp"]
        assert result["many_first_tokens"] == result["few_tokens"]


def test_samples_are_interleaved_n_per_prompt(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    n = _vllm_job.PLAIN.n
    for result in results:
        assert result["plain_uid"] == [f"p{i}" for i in range(4) for _ in range(n)]
        groups = [result["plain_tokens"][i * n : (i + 1) * n] for i in range(4)]
        assert all(len({tuple(s) for s in group}) > 1 for group in groups)


def test_tp_ranks_agree_and_dp_ranks_sample_independently(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    tp, (rank0, rank1) = ranks
    assert rank0["greedy"] == rank1["greedy"]
    if tp == 2:
        assert rank0["plain_tokens"] == rank1["plain_tokens"]
        assert rank0["filtered_tokens"] == rank1["filtered_tokens"]
        # One TP group, one shared-memory name of this job's own (not vLLM's fixed one for every
        # external_launcher job), unlinked once mapped so that a killed job leaves nothing behind.
        assert rank0["dist_ident"] == rank1["dist_ident"]
        assert rank0["dist_ident"].startswith("hybridflow-")
        assert rank0["shm_segments_left"] == rank1["shm_segments_left"] == []
    else:
        # Two dp ranks: the engine seeds differ, so fresh samples differ, and so do samples with one
        # explicit seed (each dp engine derives its own from it).
        assert rank0["plain_tokens"] != rank1["plain_tokens"]
        assert rank0["filtered_tokens"] != rank1["filtered_tokens"]


def test_explicit_seed_reproduces_each_ranks_samples(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    for result in results:
        assert result["filtered_again"] == result["filtered_tokens"]


def test_weight_push_switches_to_the_new_weights(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    for result in results:
        assert result["streamed"][0] == result["streamed"][1]
        assert result["pushed_lp_new"]["mean"] < 1e-3, result["pushed_lp_new"]
        assert result["pushed_lp_stale"]["mean"] > 0.05, result["pushed_lp_stale"]
        assert result["greedy_new"] == result["greedy_new_hf"]
        assert result["greedy_new"] != result["greedy"]


def test_release_frees_the_kv_cache_and_resume_restores_it(ranks: tuple[int, list[dict[str, Any]]]) -> None:
    _, results = ranks
    for result in results:
        assert result["freed"] == result["restored"] == result["kv_allocated"] >= _vllm_job.KV_CACHE_BYTES
        assert result["kv_allocated_released"] == 0
        assert result["rss_drop"] > 0.8 * _vllm_job.KV_CACHE_BYTES, result["rss_drop"]
        assert "resume()" in result["generate_while_released"]
        assert result["greedy_after_resume"] == result["greedy_new"]
