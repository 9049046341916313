"""Run by test_two_nodes.py in a process of its own: a 2-node Ray cluster on this machine (the pytest
process keeps its one-node session cluster), the trainer pool on the head node, the rollout pool on the
second, both pinned by custom resources. Prints one JSON line with what the test checks.

Usage: python -m tests.rollout_service._two_nodes ROOT ENGINE   (ENGINE: vllm or hf)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]


def _gap(runtime, rollouts) -> float:
    """Largest |engine - trainer| log-prob over the sampled tokens of ``rollouts``."""
    from trainer.steps import old_log_probs

    trainer = old_log_probs(runtime, rollouts)["old_log_probs"]
    mask = rollouts["response_mask"].bool()
    return float((trainer - rollouts["rollout_log_probs"]).abs()[mask].max())


def main(root: Path, engine: str) -> dict:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util import placement_group_table

    from hybridflow.protocol import Batch
    from tests.trainer._runs import run_config, write_task
    from trainer.runtime import Runtime
    from trainer.steps import generate, sampling_params, update_actor

    # Ray records the cluster address in its default temp folder, which must exist.
    (Path(tempfile.gettempdir()) / "ray").mkdir(exist_ok=True)
    env = {"env_vars": {"PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled"}}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"trainer_node": 2}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"rollout_node": 1})
    ray.init(address=cluster.address, runtime_env=env, logging_level="WARNING")
    try:
        write_task(root)
        config = run_config(
            root,
            engine,
            2,
            [
                "actor.param_dtype=float32",
                "rollout.enforce_eager=true",
                "data.train_batch_size=8",
                "actor.ppo_mini_batch_size=64",
                "actor.ppo_micro_batch_size=32",
                "resource.custom_resources={trainer_node: 1}",
                "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1, custom_resources: {rollout_node: 1}}}",
                "resource.placement={rollout: rollout_pool}",
            ],
        )
        with Runtime(config) as runtime:
            nodes = {
                name: sorted(set(placement_group_table(group)["bundles_to_node_id"].values()))
                for name, pool in runtime.pools.items()
                for group in pool.placement_groups()
            }
            prompts = runtime.next_prompts()
            runtime.begin_step()
            fresh = generate(runtime, prompts)  # pushes version 0
            fresh_gap = _gap(runtime, fresh)
            # One update with fixed advantages moves the trainer's weights for certain.
            advantages = torch.randn(fresh["responses"].shape, generator=torch.Generator().manual_seed(0))
            update_actor(runtime, fresh | Batch({"advantages": advantages * fresh["response_mask"]}))
            runtime.begin_step()
            stale = runtime.rollout.generate_sequences(prompts, sampling_params(runtime))  # no push
            stale_gap = _gap(runtime, stale)
            pushed = generate(runtime, prompts)  # pushes version 1
            pushed_gap = _gap(runtime, pushed)
            return {
                "nodes": nodes,
                "fresh_gap": fresh_gap,
                "stale_gap": stale_gap,
                "pushed_gap": pushed_gap,
                "versions": [fresh["policy_version"].unique().tolist(), pushed["policy_version"].unique().tolist()],
                "served": runtime.rollout.served_version(),
                "push_metrics": {k: v for k, v in runtime.step_metrics.items() if k.startswith("weight_push/")},
            }
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2])))
