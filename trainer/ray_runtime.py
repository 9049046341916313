"""Starting (or joining) the Ray cluster a run uses, and leaving nothing of it behind.

A local cluster lives in a temp folder of its own, ``/tmp/hybridflow-ray-*``, which records the driver
(the process that started it) in ``driver.pid``. Two things make sure the cluster goes with the driver:

- a watchdog process (`trainer.ray_watchdog`) that wakes when the driver ends, even by SIGKILL, stops
  every process still using the folder and removes it;
- each start removes the folders of earlier runs whose driver is gone (stale), with any process still
  using them, in case their watchdog could not run.

Ray 2.x's ``ray.init`` can leave out the dashboard (``include_dashboard=False``, done here) but offers no
switch for the other head processes (autoscaler monitor, log monitor, the dashboard's API server) nor
for the raylet's dashboard and runtime-env agents; those are what outlived a killed driver, and the
watchdog is what ends them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from trainer import ray_watchdog
from trainer.config import RunConfig

__all__ = ["TEMP_PREFIX", "remove_stale_temp_dirs", "start_ray"]

TEMP_PREFIX = "hybridflow-ray-"
"""Name prefix of a local cluster's temp folder (under ``/tmp``: Ray's socket paths must stay short)."""

_TEMP_ROOT = Path("/tmp")
_WATCHDOG_EXIT_S = 35.0


@contextmanager
def start_ray(config: RunConfig, address: str | None = None) -> Iterator[None]:
    """Join the cluster at ``address``, or start a local one sized for ``config``'s pools.

    A local cluster gets enough logical CPUs for every slot, its own short temp folder and the current
    ``sys.path`` for its workers, so recipes that define worker classes next to their script run
    unchanged. It starts without the dashboard; stale temp folders of dead runs are removed first; and
    if the driver dies without shutting the cluster down, the watchdog stops what is left of it (see
    the module docstring; on systems without ``/proc``, such as macOS, neither runs).
    """
    if address is not None:
        ray.init(address=address, logging_level="WARNING")
        try:
            yield
        finally:
            ray.shutdown()
        return
    resource = config.resource
    slots = resource.nodes * resource.slots_per_node + sum(
        p.nodes * p.slots_per_node for p in resource.pools.values()
    )
    num_cpus = max(os.cpu_count() or 1, int(slots * resource.cpus_per_slot) + 1)
    if not ray_watchdog.SUPPORTED:
        temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=_TEMP_ROOT))
        try:
            with _local_cluster(num_cpus, temp_dir):
                yield
        finally:
            shutil.rmtree(temp_dir, ignore_errors=True)
        return
    remove_stale_temp_dirs(_TEMP_ROOT)
    temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=_TEMP_ROOT))
    ray_watchdog.record_driver(temp_dir)
    watchdog = subprocess.Popen(
        [sys.executable, "-I", ray_watchdog.__file__, str(temp_dir), str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        with _local_cluster(num_cpus, temp_dir):
            yield
    finally:
        # Closing the pipe is the watchdog's signal: it stops any straggler and removes the folder.
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(timeout=_WATCHDOG_EXIT_S)


@contextmanager
def _local_cluster(num_cpus: int, temp_dir: Path) -> Iterator[None]:
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        _temp_dir=str(temp_dir),
        logging_level="WARNING",
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}},
    )
    try:
        yield
    finally:
        ray.shutdown()


def remove_stale_temp_dirs(root: Path) -> list[Path]:
    """Remove the ``hybridflow-ray-*`` folders under ``root`` whose driver is gone, after stopping any
    process still using them; returns the folders removed. Folders that name no driver are left alone
    (`trainer.ray_watchdog.is_stale`)."""
    stale = [folder for folder in sorted(root.glob(f"{TEMP_PREFIX}*")) if ray_watchdog.is_stale(folder)]
    for folder in stale:
        ray_watchdog.sweep(folder)
    return stale
