"""Worker groups on real Ray processes joined by a real gloo process group."""

from __future__ import annotations

import time

import pytest
import ray
import torch
from ray._private import state as ray_state

from hybridflow.controller import (
    RayWorkerGroup,
    ResourcePool,
    RoleSpec,
    WorkerDiedError,
    WorkerError,
    WorkerGroupDeadError,
    create_colocated_worker_groups,
    create_worker_groups,
)
from hybridflow.protocol import Batch
from tests.controller.workers_under_test import (
    BrokenOnRank,
    FaultyWorker,
    MeshWorker,
    Placeholder,
    StatefulRole,
    ThreadCounts,
)


@pytest.fixture(scope="module")
def mesh_group(ray_cluster):
    pool = ResourcePool([4], cpus_per_slot=0.5, name="mesh")
    group = create_colocated_worker_groups(pool, {"mesh": RoleSpec(MeshWorker)})["mesh"]
    yield group
    group.hosts.shutdown()
    pool.release()


def rows(n: int) -> Batch:
    return Batch(
        {"row_id": torch.arange(n), "x": torch.arange(n, dtype=torch.float32) * 10},
        {"name": [f"row{i}" for i in range(n)]},
    )


def test_dp_dispatch_gives_each_dp_group_its_rows_and_returns_each_row_once_in_order(mesh_group):
    out = mesh_group.tag_rows(rows(7))
    # 7 rows padded to 8 for dp=2: dp group 0 gets rows 0-3, dp group 1 rows 4-6 plus a copy of row 0.
    assert out["row_id"].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert out["name"].tolist() == [f"row{i}" for i in range(7)]
    assert out["dp_rank"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    # Only the collecting rank (tp rank 0) of each dp group contributes output.
    assert out["rank"].tolist() == [0, 0, 0, 0, 2, 2, 2]
    seen = mesh_group.rows_seen_so_far()
    assert seen[0] == seen[1] == [0, 1, 2, 3]
    assert seen[2] == seen[3] == [4, 5, 6, 0]


def test_dp_dispatch_drops_every_output_row_of_a_padding_row(mesh_group):
    # 7 rows padded to 8: the copy of row 0 in dp group 1 produces 3 rows, and all 3 are dropped.
    out = mesh_group.sample_rows(rows(7), 3)
    assert out["row_id"].tolist() == [row for row in range(7) for _ in range(3)]
    assert out["sample"].tolist() == [0, 1, 2] * 7


def test_one_to_all_all_to_all_and_rank_zero(mesh_group):
    assert mesh_group.echo("hello") == [(0, "hello"), (1, "hello"), (2, "hello"), (3, "hello")]
    assert mesh_group.square_own([1, 2, 3, 4]) == [1, 5, 11, 19]
    assert mesh_group.whoami() == 0
    assert mesh_group.rank_zero_only() == [0]
    with pytest.raises(ValueError, match="one entry per rank"):
        mesh_group.square_own([1, 2])


def test_chained_future_stays_on_the_workers(mesh_group):
    fetches_before = mesh_group.fetches
    doubled = mesh_group.double(rows(5))
    shifted = mesh_group.add_rank_parity(doubled)
    assert mesh_group.fetches == fetches_before, "chaining pulled data back to the controller"
    out = shifted.get()
    assert mesh_group.fetches == fetches_before + 1
    assert out["row_id"].tolist() == [0, 1, 2, 3, 4]
    assert out["x"].tolist() == [1.0, 21.0, 41.0, 61.0, 81.0]
    assert out["by_rank"].tolist() == [0, 0, 0, 2, 2]


def test_all_reduce_inside_the_group_sums_across_ranks(mesh_group):
    assert mesh_group.all_reduce_rank() == [10.0, 10.0, 10.0, 10.0]


def test_colocated_roles_share_a_process_but_not_state(ray_cluster):
    pool = ResourcePool([2], cpus_per_slot=0.5, name="coloc")
    groups = create_colocated_worker_groups(
        pool, {name: RoleSpec(StatefulRole, (name,)) for name in ("actor", "ref", "critic")}
    )
    try:
        for offset, group in enumerate(groups.values()):
            group.set_value(100 * (offset + 1))
        described = {name: group.describe() for name, group in groups.items()}
        for rank in range(2):
            pids = {described[name][rank][2] for name in groups}
            assert len(pids) == 1, "colocated roles must live in one process"
        assert [d[:2] for d in described["actor"]] == [("actor", 100), ("actor", 101)]
        assert [d[:2] for d in described["ref"]] == [("ref", 200), ("ref", 201)]
        assert [d[:2] for d in described["critic"]] == [("critic", 300), ("critic", 301)]
        assert described["actor"][0][2] != described["actor"][1][2]
    finally:
        next(iter(groups.values())).hosts.shutdown()
        pool.release()


def test_a_host_computes_with_its_cpus_in_the_role_thread_and_one_thread_elsewhere(ray_cluster):
    # Two CPUs a slot: the roles' thread gets both; helper threads (gloo's, here a plain one) keep
    # OpenMP's default of one and start no OpenMP team of their own (hybridflow.parallel.threads).
    pool = ResourcePool([2], cpus_per_slot=2.0, name="threads")
    group = create_colocated_worker_groups(pool, {"counts": RoleSpec(ThreadCounts)})["counts"]
    try:
        assert group.counts() == [(2, 1, "1"), (2, 1, "1")]
    finally:
        group.hosts.shutdown()
        pool.release()


def test_split_mode_puts_roles_in_separate_processes(ray_cluster):
    train_pool = ResourcePool([1], cpus_per_slot=0.5, name="train")
    reward_pool = ResourcePool([1], cpus_per_slot=0.5, name="reward")
    groups = create_worker_groups(
        {"actor": RoleSpec(StatefulRole, ("actor",)), "reward": RoleSpec(StatefulRole, ("reward",))},
        {"actor": train_pool, "reward": reward_pool},
    )
    try:
        assert groups["actor"].pids != groups["reward"].pids
        assert groups["actor"].describe()[0][2] != groups["reward"].describe()[0][2]
    finally:
        for group in groups.values():
            group.hosts.shutdown()
        train_pool.release()
        reward_pool.release()


@pytest.fixture(scope="module")
def faulty_groups(ray_cluster):
    """Hands out 2-rank `FaultyWorker` groups: the last one while it is open, else a new one. A test
    that kills a rank closes its group; a Python error leaves it working for the next test."""
    built: list[tuple[ResourcePool, RayWorkerGroup]] = []

    def open_group() -> RayWorkerGroup:
        if not built or built[-1][1].hosts.dead_reason is not None:
            pool = ResourcePool([2], cpus_per_slot=0.5, name=f"faulty{len(built)}")
            group = create_colocated_worker_groups(pool, {"faulty": RoleSpec(FaultyWorker)})["faulty"]
            built.append((pool, group))
        return built[-1][1]

    yield open_group
    for pool, group in built:
        group.hosts.shutdown()
        pool.release()


@pytest.fixture
def faulty_group(faulty_groups):
    return faulty_groups()


def test_worker_exception_names_the_rank_and_the_error(faulty_group):
    with pytest.raises(WorkerError) as caught:
        faulty_group.fail_on(1)
    assert caught.value.rank == 1
    assert isinstance(caught.value.cause, ValueError)
    assert "boom from rank 1" in str(caught.value)
    assert "faulty.fail_on raised on rank 1" in str(caught.value)
    # A Python error leaves the processes alive: the group keeps working.
    assert faulty_group.fail_on(-1) == [0, 1]


# The surviving rank stays busy this long: a controller that waited for every rank would take it all.
SURVIVOR_BUSY_S = 600.0


def test_dead_worker_fails_the_call_quickly_and_closes_the_group(faulty_group):
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as caught:
        faulty_group.exit_while_others_sleep(1, SURVIVOR_BUSY_S)
    # Ray notices a death within about a second (0.6 s seen at load 50); the bound only has to tell
    # that apart from waiting out the survivor, with room for a loaded host.
    assert time.monotonic() - start < SURVIVOR_BUSY_S / 10
    assert caught.value.rank == 1
    with pytest.raises(WorkerGroupDeadError, match=r"rank 1 died during faulty\.exit_while_others_sleep"):
        faulty_group.fail_on(-1)


def test_a_collective_broken_by_a_death_reports_the_death(faulty_group):
    """The survivor's barrier fails ("connection closed by peer") before Ray reports the death: the
    controller still names the dead rank, not the survivor's error, and closes the group."""
    with pytest.raises(WorkerDiedError) as caught:
        faulty_group.exit_on(1, notice_delay_s=1.0)
    assert caught.value.rank == 1
    survivor = caught.value.__cause__
    assert isinstance(survivor, WorkerError) and survivor.rank == 0
    with pytest.raises(WorkerGroupDeadError, match=r"rank 1 died during faulty\.exit_on"):
        faulty_group.fail_on(-1)


def actor_states() -> dict[str, tuple[str, str]]:
    """Every actor the cluster knows of: id -> (name, state). Read from the GCS, since the public
    state API (`ray.util.state`) needs the dashboard, which the test cluster does not start."""
    return {key: (value["Name"], value["State"]) for key, value in ray_state.actors().items()}


def assert_stopped_since(before: dict[str, tuple[str, str]], names: list[str], timeout_s: float = 30.0) -> None:
    """Exactly the actors ``names`` were started since ``before``, and every one of them is dead."""
    deadline = time.monotonic() + timeout_s
    while True:
        new = [value for key, value in actor_states().items() if key not in before]
        alive = sorted(name for name, state in new if state != "DEAD")
        if not alive:
            break
        assert time.monotonic() < deadline, f"still alive: {alive}"
        time.sleep(0.5)
    # The failure came after these processes existed: they were started, then stopped.
    assert sorted(name for name, _ in new) == sorted(names)


# In the three tests below the error is kept (`caught`) while the processes are checked, as a caller
# that logs or wraps it keeps it: its traceback then holds the processes' handles, so they must have
# been stopped explicitly (Ray would otherwise end them only once the last handle is collected).


def test_a_role_failing_to_build_stops_the_colocated_processes(ray_cluster):
    pool = ResourcePool([2], cpus_per_slot=0.5, name="broken-coloc")
    before = actor_states()
    try:
        with pytest.raises(WorkerError, match="cannot build on rank 1") as caught:
            # The first role builds on both ranks; the second fails on rank 1 only.
            create_colocated_worker_groups(
                pool,
                {"fine": RoleSpec(StatefulRole, ("fine",)), "broken": RoleSpec(BrokenOnRank, (1,))},
                name="broken-coloc",
            )
        assert caught.value.rank == 1
        assert_stopped_since(before, ["broken-coloc-rank0", "broken-coloc-rank1"])
    finally:
        pool.release()


def test_a_role_failing_on_a_later_pool_stops_the_earlier_pools_processes(ray_cluster):
    first = ResourcePool([1], cpus_per_slot=0.5, name="split-first")
    second = ResourcePool([2], cpus_per_slot=0.5, name="split-second")
    before = actor_states()
    try:
        with pytest.raises(WorkerError, match="cannot build on rank 0") as caught:
            create_worker_groups(
                {"fine": RoleSpec(StatefulRole, ("fine",)), "broken": RoleSpec(BrokenOnRank, (0,))},
                {"fine": first, "broken": second},
            )
        assert_stopped_since(
            before, ["split-first-fine-rank0", "split-second-broken-rank0", "split-second-broken-rank1"]
        )
        assert caught.value.role == "broken"
    finally:
        first.release()
        second.release()


def test_a_host_failing_to_start_stops_the_hosts_started_before_it(ray_cluster):
    # Another actor already holds rank 1's name: starting rank 1 fails after rank 0 was started.
    blocker = ray.remote(Placeholder).options(name="clash-rank1", num_cpus=0).remote()
    pool = ResourcePool([2], cpus_per_slot=0.5, name="clash")
    before = actor_states()
    try:
        with pytest.raises(ValueError) as caught:
            create_colocated_worker_groups(pool, {"fine": RoleSpec(StatefulRole, ("fine",))}, name="clash")
        assert_stopped_since(before, ["clash-rank0"])
        assert "clash-rank1" in str(caught.value)
        # Only what the failed start created is stopped.
        assert ray.get(blocker.ping.remote()) == "pong"
    finally:
        ray.kill(blocker)
        pool.release()
