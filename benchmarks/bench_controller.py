"""Controller overheads, each next to the raw Ray operation it is built on.

1. Round-trip latency of a trivial registered call on a 2-rank group, against a plain Ray actor
   call on two actors (``ray.get([a.f.remote() for a in actors])``).
2. Moving a 100 MB Batch to the workers and back through a data-parallel call (each rank gets and
   returns half), against ``ray.get(ray.put(array))`` of the same bytes, and against a plain Ray
   actor call that receives and returns the same numpy arrays.

Run:  python benchmarks/bench_controller.py [--calls 200] [--repeats 5] [--megabytes 100]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import ray
import torch

from hybridflow.controller import (
    DataParallel,
    ResourcePool,
    RoleSpec,
    Worker,
    create_colocated_worker_groups,
    register,
)
from hybridflow.protocol import Batch


class EchoWorker(Worker):
    @register(dispatch="one_to_all")
    def ping(self) -> int:
        return self.rank

    @register(dispatch=DataParallel())
    def echo(self, batch: Batch) -> Batch:
        return batch


@ray.remote(num_cpus=0.5)
class PlainActor:
    def ping(self) -> int:
        return 0

    def echo(self, array: np.ndarray) -> np.ndarray:
        return array


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up: first calls pay for imports and connection set-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--megabytes", type=int, default=100)
    args = parser.parse_args()

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="hf-bench-", dir="/tmp")
    ray.init(num_cpus=8, include_dashboard=False, _temp_dir=temp_dir, logging_level="WARNING")
    try:
        pool = ResourcePool([2], cpus_per_slot=0.5, name="bench")
        group = create_colocated_worker_groups(pool, {"echo": RoleSpec(EchoWorker)})["echo"]
        actors = [PlainActor.remote() for _ in range(2)]

        ours = median_seconds(lambda: [group.ping() for _ in range(args.calls)], args.repeats) / args.calls
        raw = median_seconds(
            lambda: [ray.get([a.ping.remote() for a in actors]) for _ in range(args.calls)], args.repeats
        ) / args.calls
        print(f"trivial call, 2 ranks:   hybridflow {ours * 1e3:.3f} ms   raw ray {raw * 1e3:.3f} ms   "
              f"ratio {ours / raw:.2f}x")

        rows = args.megabytes * 1024 * 1024 // (4 * 1024)
        batch = Batch({"x": torch.randn(rows, 1024)})
        array = batch["x"].numpy()
        halves = np.split(array, 2)

        def round_trip_batch() -> None:
            out = group.echo(batch)
            assert out["x"].shape == batch["x"].shape

        ours = median_seconds(round_trip_batch, args.repeats)
        put_get = median_seconds(lambda: ray.get(ray.put(array)), args.repeats)
        actor_echo = median_seconds(
            lambda: ray.get([a.echo.remote(h) for a, h in zip(actors, halves, strict=True)]), args.repeats
        )
        size_mb = batch.nbytes() / 1e6
        print(f"{size_mb:.0f} MB Batch there and back: hybridflow {ours:.3f} s")
        print(f"  raw ray.put + ray.get:       {put_get:.3f} s   ratio {ours / put_get:.2f}x")
        print(f"  raw actor echo of the arrays: {actor_echo:.3f} s   ratio {ours / actor_echo:.2f}x")
        group.hosts.shutdown()
        pool.release()
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
