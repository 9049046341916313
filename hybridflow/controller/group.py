"""`WorkerGroup`: the controller's handle on one role running on every rank of a group.

Every ``@register``'ed method of the role's class becomes a method of the group. Calling it
dispatches the arguments (see `hybridflow.controller.dispatch`), runs the method on the ranks and
collects the outputs. Non-blocking methods return a `GroupFuture` instead of the result.

**Chaining.** A `GroupFuture` from a data-parallel call can be passed straight into another
data-parallel call over the same mesh of the same group: each rank then receives the object
reference of its own dp group's output, so the rows move worker to worker (through the object
store) and never through the controller. `WorkerGroup.fetches` counts every time the controller did
pull outputs back, which makes this property testable.

Subclasses provide execution: `hybridflow.controller.ray_group.RayWorkerGroup` runs the ranks as Ray
actors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from hybridflow.contract import first_batch, require_columns
from hybridflow.controller.dispatch import DataParallel, DataParallelPlan, DispatchMode, RankCall, ShardRefs
from hybridflow.controller.register import RegisteredMethod, registered_methods
from hybridflow.controller.worker import MeshInfo
from hybridflow.protocol import Batch

__all__ = ["GroupFuture", "WorkerGroup"]


class GroupFuture:
    """The pending result of a non-blocking group call.

    Attributes:
        method: the called method's name.
        refs: one backend reference per executing rank, keyed by rank.
        mode: the dispatch mode that will collect the outputs.
        plan: the dispatch plan that ``mode.collect`` needs.
    """

    def __init__(
        self, group: WorkerGroup, method: str, refs: dict[int, Any], mode: DispatchMode, plan: Any
    ) -> None:
        self.group = group
        self.method = method
        self.refs = refs
        self.mode = mode
        self.plan = plan

    def get(self) -> Any:
        """Wait for every rank, bring the outputs to the controller and collect them."""
        outputs = self.group._fetch(self.method, self.refs)
        self.group.fetches += 1
        ordered = [outputs[rank] for rank in sorted(outputs)]
        return self.mode.collect(self.group, ordered, self.plan)

    def chainable_into(self, group: WorkerGroup, mode: DispatchMode) -> bool:
        """Whether ``group``'s ``mode`` can take this future's shards without gathering them first."""
        return (
            group.shares_ranks_with(self.group)
            and isinstance(mode, DataParallel)
            and isinstance(self.plan, DataParallelPlan)
            and self.plan.mesh == mode.mesh
        )

    def __repr__(self) -> str:
        return f"GroupFuture({self.group.role}.{self.method}, ranks={sorted(self.refs)})"


class _GroupMethod:
    """A registered worker method bound to a group."""

    def __init__(self, group: WorkerGroup, name: str, spec: RegisteredMethod, doc: str | None) -> None:
        self._group = group
        self._name = name
        self._spec = spec
        self.__doc__ = doc
        self.__name__ = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        future = self.submit(*args, **kwargs)
        if not self._spec.blocking:
            return future
        result = future.get()
        if isinstance(result, Batch):
            require_columns(result, self._spec.writes, f"{self._group.role}.{self._name}", produced=True)
        return result

    def submit(self, *args: Any, **kwargs: Any) -> GroupFuture:
        """Start the call and return its `GroupFuture` without waiting, even for a blocking method (a
        step that keeps a pool busy while it works elsewhere)."""
        spec = self._spec
        if spec.prepare is not None:
            args, kwargs = spec.prepare(args, kwargs)
        batch = first_batch(args, kwargs)
        if batch is not None:
            require_columns(batch, spec.reads, f"{self._group.role}.{self._name}")
        return self._group._call(self._name, spec, args, kwargs)

    def __repr__(self) -> str:
        return f"<group method {self._group.role}.{self._name} dispatch={self._spec.dispatch!r}>"


class WorkerGroup(ABC):
    """One role over all ranks of a group. Registered methods of ``worker_cls`` become attributes.

    Attributes:
        role: the role's name (e.g. ``"actor"``).
        worker_cls: the role's `Worker` subclass.
        fetches: how many times outputs were brought back to the controller.
    """

    def __init__(self, role: str, worker_cls: type) -> None:
        self.role = role
        self.worker_cls = worker_cls
        self.fetches = 0
        self._meshes: dict[str, list[MeshInfo]] = {}
        for name, spec in registered_methods(worker_cls).items():
            doc = getattr(worker_cls, name).__doc__
            setattr(self, name, _GroupMethod(self, name, spec, doc))

    # ------------------------------------------------------------------ backend

    @property
    @abstractmethod
    def world_size(self) -> int:
        """Number of ranks."""

    @abstractmethod
    def _submit(self, method: str, calls: list[RankCall]) -> dict[int, Any]:
        """Start ``method`` on each call's rank; return a backend reference per rank."""

    @abstractmethod
    def _fetch(self, method: str, refs: dict[int, Any]) -> dict[int, Any]:
        """Wait for the references and return their values by rank; fail fast on the first error."""

    @abstractmethod
    def _query_mesh(self, name: str) -> list[MeshInfo]:
        """Ask every rank for its `MeshInfo` in mesh ``name``."""

    @abstractmethod
    def shares_ranks_with(self, other: WorkerGroup) -> bool:
        """Whether both groups run on the same processes (colocated roles of one host set)."""

    # ------------------------------------------------------------------ dispatch

    def mesh(self, name: str) -> list[MeshInfo]:
        """`MeshInfo` of every rank for mesh ``name``, asked once and then remembered."""
        if name not in self._meshes:
            self._meshes[name] = self._query_mesh(name)
        return self._meshes[name]

    def forget_meshes(self) -> None:
        """Drop remembered meshes, for roles that re-register a mesh with another layout."""
        self._meshes.clear()

    def _call(self, method: str, spec: RegisteredMethod, args: tuple, kwargs: dict) -> GroupFuture:
        mode = spec.dispatch
        args = tuple(self._resolve_future(a, mode) for a in args)
        kwargs = {k: self._resolve_future(v, mode) for k, v in kwargs.items()}
        calls, plan = mode.dispatch(self, args, kwargs)
        if spec.execute == "rank_zero":
            calls = [call for call in calls if call.rank == 0]
        return GroupFuture(self, method, self._submit(method, calls), mode, plan)

    def _resolve_future(self, value: Any, mode: DispatchMode) -> Any:
        if not isinstance(value, GroupFuture):
            return value
        if value.chainable_into(self, mode):
            return ShardRefs([value.refs[rank] for rank in value.plan.collectors], value.plan.pad)
        return value.get()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(role={self.role!r}, world_size={self.world_size})"
