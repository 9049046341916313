"""The weight push in-process (colocated engine) against across pools (the weight group, 2 Ray nodes).

A 2-node Ray cluster on this machine (`ray.cluster_utils.Cluster`): the trainer pool on the head node,
pinned by the custom resource ``trainer_node``; in the split run the rollout pool (one HF engine) on the
second node, pinned by ``rollout_node``. The same random Qwen2 (``--hidden``, ``--layers``; fp32) is pushed
``--repeats`` times by each side, after one warm-up push that is not counted:

- **in-process**: the colocated `ReshardingManager` of the actor's process: all-gather each FSDP2
  parameter into the reused buffer and copy it into the engine in the same process
  (``to_inference`` then ``to_training``, as every colocated generation does);
- **across pools**: the same manager streams into the weight group's sender; the actor's rank 0
  broadcasts buckets of ``--bucket-mb`` over gloo to the engine on the other node, which copies each
  tensor into its model (`trainer.weight_sync.push_weights`, as every split generation does).

Each side runs in a runtime of its own, one after the other. Seconds are the push's wall time on the
trainer side (rank 0: gather, broadcast or copy, and for the split side the wait for the engine); MB are
the weight bytes moved; MB/s their ratio. The table shows medians; the ratio is across / in-process.

    RAY_AUTH_MODE=disabled python benchmarks/bench_weight_push.py [--hidden 512] [--layers 8]
        [--repeats 5] [--bucket-mb 16] [--trainer-ranks 1]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from hybridflow.controller import register
from hybridflow.data import write_rows
from trainer.config import load_config
from trainer.runtime import Runtime
from trainer.weight_sync import push_weights
from workers.actor import ActorRolloutRefWorker

REPO = Path(__file__).resolve().parents[1]


class PushingActor(ActorRolloutRefWorker):
    """The shipped actor, with a push on demand (no generation) for either placement."""

    @register(dispatch="one_to_all")
    def colocated_push(self) -> dict[str, float]:
        """One in-process switch train -> inference -> train; its seconds and MB on this rank."""
        start = time.perf_counter()
        report = self.resharder.to_inference()
        self.resharder.to_training()
        return {"s": time.perf_counter() - start, "mb": report.bytes_streamed / 2**20}

    @register(dispatch="one_to_all")
    def forget_push(self) -> None:
        """Make the next `push_weights` send the weights again although the version is unchanged."""
        self._pushed_version = None


def _config(root: Path, args: argparse.Namespace, split: bool) -> object:
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}]
    write_rows(rows * 8, root / "train.parquet")
    overrides = [
        f"data.train_files=[{root / 'train.parquet'}]",
        "data.max_prompt_length=8",
        "data.max_response_length=8",
        "data.train_batch_size=8",
        f"model.tiny.hidden_size={args.hidden}",
        f"model.tiny.num_layers={args.layers}",
        "model.tiny.num_heads=8",
        "model.tiny.num_kv_heads=8",
        f"model.tiny.intermediate_size={3 * args.hidden}",
        "model.tiny.max_position_embeddings=64",
        "rollout.engine=hf",
        "rollout.n=2",
        "actor.param_dtype=float32",
        f"actor.ppo_mini_batch_size={16 // args.trainer_ranks * args.trainer_ranks}",
        f"resharding.bucket_bytes={args.bucket_mb << 20}",
        "trainer.total_steps=1",
        "trainer.loggers=[jsonl]",
        f"trainer.output_dir={root / ('split' if split else 'colocated')}",
        f"resource.slots_per_node={args.trainer_ranks}",
        "resource.cpus_per_slot=0.5",
        "resource.custom_resources={trainer_node: 1}",
    ]
    if split:
        overrides += [
            "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1, custom_resources: {rollout_node: 1}}}",
            "resource.placement={rollout: rollout_pool}",
        ]
    return load_config(None, overrides)


def _measure(root: Path, args: argparse.Namespace, split: bool) -> dict[str, float]:
    seconds, mb = [], 0.0
    with Runtime(_config(root, args, split), worker_classes={"actor_rollout": PushingActor}) as runtime:
        for repeat in range(args.repeats + 1):
            if split:
                runtime.actor.forget_push()
                start = time.perf_counter()
                metrics = push_weights(runtime.actor, runtime.rollout)
                took, mb = time.perf_counter() - start, metrics["weight_push/mb"]
            else:
                report = runtime.actor.colocated_push()[0]
                took, mb = report["s"], report["mb"]
            if repeat:  # the first push warms up
                seconds.append(took)
    median = statistics.median(seconds)
    return {"mb": mb, "s": median, "mb_per_s": mb / median, "fastest_s": min(seconds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bucket-mb", type=int, default=16)
    parser.add_argument("--trainer-ranks", type=int, default=1)
    args = parser.parse_args()
    (Path(tempfile.gettempdir()) / "ray").mkdir(exist_ok=True)  # Ray records the cluster address there
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"trainer_node": args.trainer_ranks}, "include_dashboard": False},
    )
    cluster.add_node(num_cpus=1, resources={"rollout_node": 1})
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, logging_level="WARNING")
    try:
        with tempfile.TemporaryDirectory() as folder:
            results = {
                "in-process": _measure(Path(folder), args, split=False),
                "across pools (gloo, 2 nodes)": _measure(Path(folder), args, split=True),
            }
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(f"model: hidden {args.hidden}, {args.layers} layers, fp32; bucket {args.bucket_mb} MB; "
          f"{args.trainer_ranks} trainer rank(s); median of {args.repeats} pushes")
    print(f"{'side':<30} {'MB':>8} {'seconds':>9} {'MB/s':>8} {'fastest s':>10}")
    for side, row in results.items():
        print(f"{side:<30} {row['mb']:>8.1f} {row['s']:>9.3f} {row['mb_per_s']:>8.0f} {row['fastest_s']:>10.3f}")
    ratio = results["across pools (gloo, 2 nodes)"]["s"] / results["in-process"]["s"]
    print(f"ratio across / in-process (seconds): {ratio:.2f}x")


if __name__ == "__main__":
    main()
