"""The Ray backend: host processes in a `ResourcePool`, and `RayWorkerGroup` views over them.

`RayHostSet` starts one `WorkerHost` actor per slot of a pool and joins them into one
``torch.distributed`` process group. Each role placed on that host set is a `RayWorkerGroup`; roles
on the same host set are *colocated*: they are objects in the same processes (same PIDs) and share
the process group and the devices. `create_worker_groups` maps roles to pools: roles given the same
pool are colocated, roles given different pools run in different processes.

Failures: the controller waits on all ranks at once and returns on the first error. A method that
raises becomes a `WorkerError` naming the rank; a process that dies becomes a `WorkerDiedError`
within seconds, and the host set is shut down, since its collectives can no longer complete. When a
peer's death breaks a collective, the survivors' errors can arrive first: a raised error is held for
a few seconds while the other ranks are watched for a death, which is then reported instead.
Construction is all or nothing: when starting a host set, or building a role in it, fails part-way,
every process started for it is stopped before the error propagates.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.controller.dispatch import RankCall
from hybridflow.controller.errors import WorkerDiedError, WorkerError, WorkerGroupDeadError
from hybridflow.controller.group import GroupFuture, WorkerGroup
from hybridflow.controller.host import WorkerHost
from hybridflow.controller.resource_pool import ResourcePool
from hybridflow.controller.worker import MeshInfo, Worker
from hybridflow.protocol import Batch

__all__ = [
    "RayHostSet",
    "RayWorkerGroup",
    "RoleSpec",
    "create_colocated_worker_groups",
    "create_worker_groups",
    "shutdown_worker_groups",
    "wait_together",
]

log = logging.getLogger(__name__)

# How long, after a rank raised while others are still busy, to watch those for a death: Ray reports a
# dead process within about a second (its wait for the death notice is 1 s; 0.6 s seen at load 50).
_DEATH_NOTICE_S = 5.0


@dataclass(frozen=True)
class RoleSpec:
    """A role to instantiate on every rank: its class and constructor arguments."""

    cls: type[Worker]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


class RayHostSet:
    """One `WorkerHost` actor per slot of ``pool``, joined in one process group.

    Args:
        pool: where the processes go.
        name: a label for the processes (Ray actor names are ``{name}-rank{r}``).
        init_timeout_s: how long start-up (process start and process-group rendezvous) may take.
        collective_timeout_s: the process group's timeout for a collective to complete.

    If start-up fails part-way (a process cannot be created, the rendezvous fails or times out, or the
    caller is interrupted), the processes already started are stopped and the error propagates.
    """

    def __init__(
        self, pool: ResourcePool, name: str, init_timeout_s: float = 120.0, collective_timeout_s: float = 1800.0
    ) -> None:
        self.pool = pool
        self.name = name
        self.dead_reason: str | None = None
        # Filled one process at a time, so that a failure at any point knows what to stop.
        self.hosts: list[Any] = []
        try:
            host_cls = ray.remote(WorkerHost)
            slots = pool.slots()
            resources = pool.process_resources
            # Ray's own rule for a process's OpenMP threads, given here to the host's main thread
            # only; the process default of one keeps gloo's helper threads from starting teams.
            torch_threads = max(1, int(resources["num_cpus"]))
            for rank, slot in enumerate(slots):
                self.hosts.append(
                    host_cls.options(
                        name=f"{name}-rank{rank}",
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            slot.placement_group, slot.bundle_index
                        ),
                        max_concurrency=1,
                        runtime_env={"env_vars": {"OMP_NUM_THREADS": "1"}},
                        **resources,
                    ).remote(rank, len(slots), slot.local_rank, pool.use_gpu, torch_threads)
                )
            addr, port = ray.get(self.hosts[0].rendezvous_address.remote(collective_timeout_s), timeout=init_timeout_s)
            self.pids: list[int] = ray.get(
                [h.init_distributed.remote(addr, port, collective_timeout_s) for h in self.hosts],
                timeout=init_timeout_s,
            )
        except BaseException:
            self._stop_after_failure("start-up failed")
            raise

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    def create_role(self, role: str, spec: RoleSpec) -> RayWorkerGroup:
        """Instantiate ``spec`` on every host as ``role`` and return the role's group.

        A constructor that raises on some rank gives `WorkerError`; the processes stay up (other roles
        may live in them), so the caller decides whether to `shutdown`.
        """
        refs = [h.create_role.remote(role, spec.cls, spec.args, dict(spec.kwargs)) for h in self.hosts]
        self.wait(role, "__init__", dict(enumerate(refs)))
        return RayWorkerGroup(self, role, spec.cls)

    def wait(self, role: str, method: str, refs: dict[int, Any]) -> dict[int, Any]:
        """Values of ``refs`` by rank. Returns at the first error instead of waiting for every rank."""
        if self.dead_reason is not None:
            raise WorkerGroupDeadError(f"host set {self.name!r} is shut down: {self.dead_reason}")
        rank_of = {ref: rank for rank, ref in refs.items()}
        pending = list(refs.values())
        results: dict[int, Any] = {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ref = ready[0]
            rank = rank_of[ref]
            try:
                results[rank] = ray.get(ref)
            except RayActorError as error:
                self.shutdown(f"rank {rank} died during {role}.{method}")
                raise WorkerDiedError(rank, role, method, str(error).splitlines()[0]) from None
            except RayTaskError as error:
                cause = error.cause if isinstance(error.cause, BaseException) else None
                raised = WorkerError(rank, role, method, cause, str(error))
                died = _death_among(pending, rank_of)
                if died is not None:
                    dead_rank, detail = died
                    self.shutdown(f"rank {dead_rank} died during {role}.{method}")
                    raise WorkerDiedError(dead_rank, role, method, detail) from raised
                raise raised from None
        return results

    def shutdown(self, reason: str = "shut down on request") -> None:
        """Stop every host process. Later calls raise `WorkerGroupDeadError` naming ``reason``."""
        if self.dead_reason is None:
            self.dead_reason = reason
        for host in self.hosts:
            ray.kill(host, no_restart=True)

    def _stop_after_failure(self, reason: str) -> None:
        """`shutdown` while another error is propagating: a failure to stop is logged, not raised, so
        that it cannot replace the error that caused it."""
        try:
            self.shutdown(reason)
        except Exception:
            log.exception("could not stop the processes of host set %r", self.name)


def _death_among(pending: list[Any], rank_of: dict[Any, int]) -> tuple[int, str] | None:
    """``(rank, detail)`` of a process among ``pending`` that turns out to have died within
    `_DEATH_NOTICE_S`, or None.

    A rank's raised error may be the echo of another's death: a collective fails with "connection
    closed by peer" as soon as the peer's process is gone, and that error can reach the controller
    before Ray's notice of the death does (a third of the time on a loaded 2-core host). The death
    is the cause to report, and the group must be shut down for it.
    """
    died = _dead_ref(pending)
    return None if died is None else (rank_of[died[0]], died[1])


def _dead_ref(pending: list[Any]) -> tuple[Any, str] | None:
    """``(ref, detail)`` of a call among ``pending`` whose process turns out to have died within
    `_DEATH_NOTICE_S`, or None (`_death_among`)."""
    deadline = time.monotonic() + _DEATH_NOTICE_S
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            try:
                ray.get(ref)
            except RayActorError as error:
                return ref, str(error).splitlines()[0]
            except RayTaskError:
                continue
    return None


class RayWorkerGroup(WorkerGroup):
    """One role on every host of a `RayHostSet`. Build with `create_worker_groups`."""

    def __init__(self, hosts: RayHostSet, role: str, worker_cls: type[Worker]) -> None:
        self.hosts = hosts
        super().__init__(role, worker_cls)

    @property
    def world_size(self) -> int:
        return self.hosts.world_size

    @property
    def pids(self) -> list[int]:
        """The process id behind each rank."""
        return list(self.hosts.pids)

    def shares_ranks_with(self, other: WorkerGroup) -> bool:
        return isinstance(other, RayWorkerGroup) and other.hosts is self.hosts

    def _submit(self, method: str, calls: list[RankCall]) -> dict[int, Any]:
        if self.hosts.dead_reason is not None:
            raise WorkerGroupDeadError(f"{self.role}.{method}: worker group is shut down: {self.hosts.dead_reason}")
        # Serialise each distinct Batch once: the tp ranks of one dp group share the shard's object.
        stored: dict[int, Any] = {}

        def store(value: Any) -> Any:
            if not isinstance(value, Batch):
                return value
            if id(value) not in stored:
                stored[id(value)] = ray.put(value)
            return stored[id(value)]

        return {
            call.rank: self.hosts.hosts[call.rank].execute.remote(
                self.role,
                method,
                *(store(a) for a in call.args),
                **{k: store(v) for k, v in call.kwargs.items()},
            )
            for call in calls
        }

    def _fetch(self, method: str, refs: dict[int, Any]) -> dict[int, Any]:
        return self.hosts.wait(self.role, method, refs)

    def _query_mesh(self, name: str) -> list[MeshInfo]:
        refs = {rank: host.mesh_info.remote(self.role, name) for rank, host in enumerate(self.hosts.hosts)}
        infos = self.hosts.wait(self.role, f"mesh_info({name!r})", refs)
        return [infos[rank] for rank in range(self.world_size)]


def create_colocated_worker_groups(
    pool: ResourcePool, roles: Mapping[str, RoleSpec], name: str | None = None, **host_options: Any
) -> dict[str, RayWorkerGroup]:
    """Start one process per slot of ``pool`` holding every role in ``roles``; a group per role.

    If a role's constructor raises (`WorkerError`), or anything else fails before every role is built,
    the processes are stopped before the error propagates. The pool's placement groups stay: they
    belong to the caller.
    """
    hosts = RayHostSet(pool, name or f"{pool.name}-{'-'.join(roles)}", **host_options)
    try:
        return {role: hosts.create_role(role, spec) for role, spec in roles.items()}
    except BaseException:
        hosts._stop_after_failure("a role failed to start")
        raise


def create_worker_groups(
    roles: Mapping[str, RoleSpec], placement: Mapping[str, ResourcePool], **host_options: Any
) -> dict[str, RayWorkerGroup]:
    """Place each role on its pool: roles that share a pool share processes (colocation); roles on
    different pools get processes of their own (split mode). Each pool's processes are named
    ``{pool.name}-{role}-...-rank{r}`` after the roles they hold.

    All or nothing: if any pool's processes or roles fail to start, the processes already started
    for every pool are stopped before the error propagates (the placement groups stay the caller's).
    """
    missing = sorted(set(roles) - set(placement))
    if missing:
        raise KeyError(f"roles {missing} have no resource pool; placement names {sorted(placement)}")
    by_pool: dict[int, tuple[ResourcePool, dict[str, RoleSpec]]] = {}
    for role, spec in roles.items():
        pool = placement[role]
        by_pool.setdefault(id(pool), (pool, {}))[1][role] = spec
    groups: dict[str, RayWorkerGroup] = {}
    try:
        for pool, pool_roles in by_pool.values():
            groups.update(create_colocated_worker_groups(pool, pool_roles, **host_options))
    except BaseException:
        # The failing pool stopped its own processes; stop those of the pools that had started.
        shutdown_worker_groups(groups.values(), "another role failed to start")
        raise
    return groups


def shutdown_worker_groups(groups: Iterable[RayWorkerGroup], reason: str) -> None:
    """Stop the processes behind ``groups``, each host set once (colocated groups share one).

    Meant for cleanup while an error propagates: a host set that cannot be stopped is logged and the
    others are still stopped; nothing is raised.
    """
    for hosts in {id(group.hosts): group.hosts for group in groups}.values():
        hosts._stop_after_failure(reason)


def wait_together(futures: Sequence[GroupFuture]) -> list[Any]:
    """The results of ``futures`` of groups on different host sets that take part in one collective
    (a weight push: the actor's sender and the rollout pool's receivers), in order.

    Waits on every rank of every future at once and stops at the first failure: a rank that raised or
    died fails the call with its group's `WorkerError` or `WorkerDiedError` (naming role, method and
    rank), while the peers would wait on it until their collective's timeout. A raised error that
    echoes a death in another group (a broken connection) is reported as that death. Every other host
    set of ``futures`` is then shut down too, since its half of the collective cannot complete.
    """
    owner = {ref: future for future in futures for ref in future.refs.values()}
    pending = list(owner)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        failed = owner[ready[0]]
        try:
            ray.get(ready[0])
            continue
        except RayActorError:
            pass
        except RayTaskError:
            # The error may echo a peer's death in the other pool: report the death instead.
            died = _dead_ref(pending)
            if died is not None:
                failed = owner[died[0]]
        for other in futures:
            if isinstance(other.group, RayWorkerGroup) and other.group.hosts is not failed.group.hosts:
                other.group.hosts._stop_after_failure(
                    f"{failed.group.role}.{failed.method} failed in a collective with this host set"
                )
        # The failed future goes first: its group raises its own error (role, method, rank).
        return [f.get() for f in (failed, *futures)]
    return [future.get() for future in futures]
