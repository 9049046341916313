"""Weights arrive across nodes: the trainer pool on one Ray node, the rollout pool on another
(`ray.cluster_utils.Cluster`, 2 nodes on this machine, pools pinned by custom resources), with the vLLM
engine (the HF engine takes the same path in test_split_grpo.py and test_rollout_death.py).

After each push the engine's log-probs of its sampled tokens equal the trainer's recomputation to 1e-5
(fp32), and the engine reports the pushed version. Before the second push, after an update, the engine
is stale: its gap is far larger, which shows that the check can fail. The cluster runs in a child
process (`_two_nodes.py`) so that this one keeps its session cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("two_nodes")
    run = subprocess.run(
        [sys.executable, "-m", "tests.rollout_service._two_nodes", str(root), "vllm"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_pools_sit_on_different_nodes(result):
    nodes = result["nodes"]
    assert len(nodes["global"]) == 1 and len(nodes["rollout_pool"]) == 1
    assert nodes["global"] != nodes["rollout_pool"]


def test_engine_log_probs_equal_the_trainers_after_each_push(result):
    assert result["fresh_gap"] < 1e-5
    assert result["pushed_gap"] < 1e-5
    assert result["stale_gap"] > 1e-3, "the update did not move the weights: the check could not fail"


def test_engine_reports_the_pushed_version(result):
    assert result["versions"] == [[0], [1]]
    assert result["served"] == [1]
    metrics = result["push_metrics"]
    assert metrics["weight_push/version"] == 1
    assert metrics["weight_push/mb"] > 0 and metrics["weight_push/s"] > 0
