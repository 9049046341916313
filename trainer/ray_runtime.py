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
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray

from hybridflow.metrics.log_routing import LOG_DIR, clear_log_dir, route_driver_output, worker_output_hook
from trainer import ray_watchdog
from trainer.config import RunConfig

__all__ = ["TEMP_PREFIX", "RayStart", "remove_stale_temp_dirs", "start_ray"]

TEMP_PREFIX = "hybridflow-ray-"
"""Name prefix of a local cluster's temp folder (under ``/tmp``: Ray's socket paths must stay short)."""

_TEMP_ROOT = Path("/tmp")
_WATCHDOG_EXIT_S = 35.0


@dataclass(frozen=True)
class RayStart:
    """What `start_ray` yields: ``seconds`` it took to start (or join) the cluster, and the run's log
    folder (``<trainer.output_dir>/logs``) when ``trainer.console`` is ``quiet`` (None when verbose)."""

    seconds: float
    log_dir: Path | None


@contextmanager
def start_ray(config: RunConfig, address: str | None = None) -> Iterator[RayStart]:
    """Join the cluster at ``address``, or start a local one sized for ``config``'s pools.

    A local cluster gets enough logical CPUs for every slot, its own short temp folder and the current
    ``sys.path`` for its workers, so recipes that define worker classes next to their script run
    unchanged. It starts without the dashboard; stale temp folders of dead runs are removed first; and
    if the driver dies without shutting the cluster down, the watchdog stops what is left of it (see
    the module docstring; on systems without ``/proc``, such as macOS, neither runs).

    With ``trainer.console: quiet`` every worker process of the run writes its output to
    ``<trainer.output_dir>/logs/worker-<pid>.log`` (the log files of an earlier run there are
    removed), and this process's library warnings go to ``logs/driver.log``, until the block ends
    (`hybridflow.metrics.log_routing`).
    """
    log_dir = _fresh_log_dir(config) if config.trainer.console == "quiet" else None
    runtime_env: dict[str, object] = {}
    with ExitStack() as routes:
        if log_dir is not None:
            runtime_env["worker_process_setup_hook"] = worker_output_hook(log_dir)
            routes.enter_context(route_driver_output(log_dir))
        started = time.perf_counter()
        with _cluster(config, address, runtime_env):
            yield RayStart(time.perf_counter() - started, log_dir)


def _fresh_log_dir(config: RunConfig) -> Path:
    log_dir = Path(config.trainer.output_dir).resolve() / LOG_DIR
    clear_log_dir(log_dir)
    return log_dir


@contextmanager
def _cluster(config: RunConfig, address: str | None, runtime_env: dict[str, object]) -> Iterator[None]:
    if address is not None:
        ray.init(address=address, logging_level="WARNING", runtime_env=runtime_env)
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
    custom = _custom_resource_totals(config)
    runtime_env = {**runtime_env, "env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
    if not ray_watchdog.SUPPORTED:
        temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=_TEMP_ROOT))
        try:
            with _local_cluster(num_cpus, custom, temp_dir, runtime_env):
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
        with _local_cluster(num_cpus, custom, temp_dir, runtime_env):
            yield
    finally:
        # Closing the pipe is the watchdog's signal: it stops any straggler and removes the folder.
        assert watchdog.stdin is not None
        watchdog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            watchdog.wait(timeout=_WATCHDOG_EXIT_S)


def _custom_resource_totals(config: RunConfig) -> dict[str, float]:
    """Every custom resource the pools reserve (``resource.custom_resources``, ``resource.pools.*.
    custom_resources``), summed over their slots: what a local one-node cluster offers, so a config
    written for a multi-node cluster also runs on one machine."""
    resource = config.resource
    sized = [(resource.nodes * resource.slots_per_node, resource.custom_resources)]
    sized += [(pool.nodes * pool.slots_per_node, pool.custom_resources) for pool in resource.pools.values()]
    totals: dict[str, float] = {}
    for slots, amounts in sized:
        for name, amount in amounts.items():
            totals[name] = totals.get(name, 0.0) + slots * amount
    return totals


@contextmanager
def _local_cluster(
    num_cpus: int, custom: dict[str, float], temp_dir: Path, runtime_env: dict[str, object]
) -> Iterator[None]:
    ray.init(
        num_cpus=num_cpus,
        resources=custom,
        include_dashboard=False,
        _temp_dir=str(temp_dir),
        logging_level="WARNING",
        runtime_env=runtime_env,
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
