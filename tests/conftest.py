"""Shared fixtures: one local Ray cluster per test session, started on first use."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Ray keeps an auth token under the home directory unless told not to; tests must leave no trace.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster with more logical CPUs than cores, so small groups fit on 2 cores.

    Worker processes get the repository on their path, so worker classes defined in test modules
    import there as they do here.
    """
    import ray

    # Ray's socket paths must stay short: pytest's tmp_path is too long for them.
    temp_dir = tempfile.mkdtemp(prefix="hf-ray-", dir="/tmp")
    ray.init(
        num_cpus=16,
        include_dashboard=False,
        _temp_dir=temp_dir,
        object_store_memory=2 * 1024**3,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled"}},
        logging_level="WARNING",
        # Ray would start idle worker processes for plain tasks, up to one per logical CPU; the tests'
        # worker groups are actors with a runtime environment of their own, which never use them.
        _system_config={"prestart_worker_first_driver": False},
    )
    yield ray
    ray.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)
