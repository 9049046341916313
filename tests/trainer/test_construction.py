"""A runtime whose construction fails leaves no worker process and no placement group behind.

Two real failures, each after worker processes exist: the metrics file cannot be opened (the logger
starts after every role has loaded), and the reward model cannot load (after the actor has loaded in
the same processes). The first is checked through `Runtime`, which must stop the processes and give
the placement groups back. The second is checked one level down, in `build_worker_groups`, which must
stop the processes it started by itself, while the pools it was given stay its caller's: removing a
placement group also ends the actors in it, so through `Runtime` the pool release alone would hide a
leak there. The HF engine keeps these constructions cheap; what is checked does not depend on the engine.
"""

from __future__ import annotations

import time

import pytest
import ray
from ray._private import state as ray_state

from hybridflow.controller import WorkerError
from tests.trainer._runs import run_config, write_task
from tests.workers._policy import write_reward_model
from trainer.config import derive_sizes
from trainer.model_setup import prepare_model_dir
from trainer.roles import build_pools, build_worker_groups
from trainer.runtime import Runtime


def cluster_state() -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
    """Every actor (id -> name, state) and placement group (id -> name, state) the cluster knows of.

    Read from the GCS: the public state API (`ray.util.state`) needs the dashboard, which the test
    cluster does not start.
    """
    actors = {key: (value["Name"], value["State"]) for key, value in ray_state.actors().items()}
    groups = {key: (value["name"], value["state"]) for key, value in ray.util.placement_group_table().items()}
    return actors, groups


def assert_gone_since(before, placement_groups: bool = True, timeout_s: float = 30.0) -> None:
    """The two ranks' actors (and the pool's placement group) created since ``before`` existed and
    are all gone; with ``placement_groups`` False, the placement group is still held instead."""
    actors_before, groups_before = before
    deadline = time.monotonic() + timeout_s
    while True:
        actors, groups = cluster_state()
        new_actors = {key: value for key, value in actors.items() if key not in actors_before}
        new_groups = {key: value for key, value in groups.items() if key not in groups_before}
        alive = [name for name, status in new_actors.values() if status != "DEAD"]
        held = [name for name, status in new_groups.values() if status != "REMOVED"]
        if not alive and (not held or not placement_groups):
            break
        assert time.monotonic() < deadline, f"still alive: actors {alive}, placement groups {held}"
        time.sleep(0.5)
    # The failure came after the two ranks' processes and the pool's placement group existed.
    assert sorted(name.rsplit("-", 1)[1] for name, _ in new_actors.values()) == ["rank0", "rank1"]
    assert [name for name, _ in new_groups.values()] == ["global-node0"]
    if not placement_groups:
        assert held == ["global-node0"]


def test_a_logger_that_cannot_start_stops_the_workers(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    # The jsonl logger appends to run/metrics.jsonl: a directory there fails it, after every role loaded.
    (root / "run" / "metrics.jsonl").mkdir(parents=True)
    config = run_config(root, "hf", 1)
    before = cluster_state()
    with pytest.raises(IsADirectoryError):
        Runtime(config)
    assert_gone_since(before)


def test_a_reward_model_that_cannot_load_stops_the_workers(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    # Two labels: the worker refuses it when loading, after the actor has loaded in the same processes.
    rm_dir = write_reward_model(root / "two_labels", num_labels=2)
    config = run_config(root, "hf", 1, [f"reward_model.path={rm_dir}"])
    model_dir = prepare_model_dir(config, root / "run")
    pools = build_pools(config)
    before = cluster_state()
    try:
        with pytest.raises(WorkerError, match="a reward model has one label, this one has 2"):
            build_worker_groups(config, derive_sizes(config), 1, model_dir, pools)
        assert_gone_since(before, placement_groups=False)
    finally:
        for pool in pools.values():
            pool.release()
