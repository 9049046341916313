"""Starting (or joining) the Ray cluster a run uses."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from trainer.config import RunConfig

__all__ = ["start_ray"]


@contextmanager
def start_ray(config: RunConfig, address: str | None = None) -> Iterator[None]:
    """Join the cluster at ``address``, or start a local one sized for ``config``'s pools.

    A local cluster gets enough logical CPUs for every slot, its own short temp directory (Ray's
    socket paths must stay short) and the current ``sys.path`` for its workers, so recipes that
    define worker classes next to their script run unchanged.
    """
    if address is not None:
        ray.init(address=address, logging_level="WARNING")
        try:
            yield
        finally:
            ray.shutdown()
        return
    resource = config.resource
    slots = resource.nodes * resource.slots_per_node + sum(p.nodes * p.slots_per_node for p in resource.pools.values())
    temp_dir = tempfile.mkdtemp(prefix="hybridflow-ray-", dir="/tmp")
    ray.init(
        num_cpus=max(os.cpu_count() or 1, int(slots * resource.cpus_per_slot) + 1),
        include_dashboard=False,
        _temp_dir=temp_dir,
        logging_level="WARNING",
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
    )
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
