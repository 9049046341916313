"""Exact tokens on the vLLM engine: multi-turn episodes continued from their token prefixes (prefix
caching on), the trained ids equal to the sampled and inserted ids, the engine's log-probs equal to the
trainer's."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridflow.parallel.launch import run_ranks
from tests.agents import _vllm_job

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow


def test_vllm_episodes_train_on_the_exact_sampled_and_inserted_ids(tiny_model_dir: Path):
    (result,) = run_ranks(_vllm_job.episode_checks, 1, tiny_model_dir, timeout_s=400)
    assert result["finish"] == ["done"] * 8
    assert result["responses"] == result["expected"]
    assert result["loss_mask"] == result["expected_mask"]
    assert result["policy_tokens"] > 40
    # fp32 engine and trainer on the same weights (the rollout tests' bound).
    assert result["lp_gap_max"] < 1e-2, result["lp_gap_max"]
