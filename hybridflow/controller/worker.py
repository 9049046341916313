"""`Worker`: the base class of every role (actor, rollout, reference, critic, reward model).

One worker *process* serves one device slot. It may hold several role objects at once (colocation):
a sharded training model, an inference engine and a reference model all live side by side in the
same process and share its ``torch.distributed`` process group. The process-wide facts (rank, world
size, rendezvous address, local device) are a `WorkerContext` that the hosting process installs
before any role is constructed; every role object in the process reads the same context.

Each role can publish *named meshes*: how its ranks are grouped for data parallelism. The controller
asks a role for the `MeshInfo` of a mesh when it first dispatches a call over that mesh, so that a
data-parallel call sends one shard per dp group and collects it from exactly one rank of that group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hybridflow.parallel.device import DevicePlan

__all__ = ["MeshInfo", "Worker", "WorkerContext", "current_context", "install_context"]

WORLD_MESH = "world"


@dataclass(frozen=True)
class WorkerContext:
    """Where one worker process sits in its group.

    Attributes:
        rank: global rank in the group's process group.
        world_size: number of processes in the group.
        local_rank: index of this process among the group's processes on its node.
        master_addr: rendezvous host of the group's process group (rank 0's node).
        master_port: rendezvous port.
        use_gpu: whether this process owns a GPU slot; its `DevicePlan` (device, process-group
            backend, default dtype, attention) follows this, not what the machine has.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    use_gpu: bool

    @property
    def device_plan(self) -> DevicePlan:
        """Where this process computes (device, backend, default dtype, attention), from ``use_gpu``."""
        # Imported here: hybridflow.parallel loads transformers, which the controller process does not need.
        from hybridflow.parallel.device import local_device_plan

        return local_device_plan(self.use_gpu)

    @property
    def device(self) -> torch.device:
        return self.device_plan.device

    @property
    def backend(self) -> str:
        """The process group's backend: ``"gloo"`` on CPU, ``"nccl"`` on GPU."""
        return self.device_plan.backend


_SINGLE_PROCESS = WorkerContext(
    rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1", master_port=0, use_gpu=False
)
_context: WorkerContext | None = None


def install_context(context: WorkerContext) -> None:
    """Make ``context`` this process's worker context and export it to libraries that read the env.

    torch.distributed's env:// rendezvous and vLLM's ``external_launcher`` read ``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` from the environment.
    """
    global _context
    _context = context
    os.environ.update(
        RANK=str(context.rank),
        LOCAL_RANK=str(context.local_rank),
        WORLD_SIZE=str(context.world_size),
        MASTER_ADDR=context.master_addr,
        MASTER_PORT=str(context.master_port),
    )


def current_context() -> WorkerContext:
    """This process's context; a single-process context (rank 0 of 1) outside a worker group."""
    return _context if _context is not None else _SINGLE_PROCESS


@dataclass(frozen=True)
class MeshInfo:
    """One rank's place in a named data-parallel mesh.

    Attributes:
        dp_rank: index of the rank's data-parallel group.
        dp_size: number of data-parallel groups.
        is_collector: whether the controller takes this rank's output as its dp group's output
            (exactly one rank per dp group, e.g. tp rank 0).
    """

    dp_rank: int
    dp_size: int
    is_collector: bool


class Worker:
    """Base class of role objects. Subclasses mark their public methods with ``@register``.

    The constructor of a subclass runs inside the worker process after the process group is up,
    so it may already use collectives. Heavy state (models, engines) belongs in a registered
    ``init_model``-style method rather than the constructor, so the controller can time it.
    """

    def __init__(self) -> None:
        self._meshes: dict[str, MeshInfo] = {}

    @property
    def context(self) -> WorkerContext:
        return current_context()

    @property
    def rank(self) -> int:
        return self.context.rank

    @property
    def world_size(self) -> int:
        return self.context.world_size

    @property
    def local_rank(self) -> int:
        return self.context.local_rank

    @property
    def master_addr(self) -> str:
        return self.context.master_addr

    @property
    def master_port(self) -> int:
        return self.context.master_port

    @property
    def device(self) -> torch.device:
        return self.context.device

    @property
    def device_plan(self) -> DevicePlan:
        return self.context.device_plan

    def register_mesh(self, name: str, dp_rank: int, dp_size: int, is_collector: bool) -> None:
        """Publish this rank's place in the data-parallel mesh ``name``."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"mesh {name!r}: dp_rank {dp_rank} outside [0, {dp_size})")
        self._meshes[name] = MeshInfo(dp_rank, dp_size, is_collector)

    def register_device_mesh(self, name: str, mesh: torch.distributed.device_mesh.DeviceMesh, dp_dim: str) -> None:
        """Publish a mesh from a torch ``DeviceMesh``: dp is the ``dp_dim`` coordinate, and the rank
        with coordinate 0 on every other dimension collects for its dp group."""
        names = mesh.mesh_dim_names
        if names is None or dp_dim not in names:
            raise ValueError(f"mesh {name!r}: device mesh has dims {names}, no {dp_dim!r} dim")
        coordinate = mesh.get_coordinate()
        if coordinate is None:
            raise ValueError(f"mesh {name!r}: rank {self.rank} is not part of the device mesh")
        dp_index = names.index(dp_dim)
        others = [c for i, c in enumerate(coordinate) if i != dp_index]
        self.register_mesh(name, coordinate[dp_index], mesh.size(dp_index), all(c == 0 for c in others))

    def mesh_info(self, name: str) -> MeshInfo:
        """This rank's place in mesh ``name``; the mesh ``"world"`` (dp over all ranks) always exists."""
        if name in self._meshes:
            return self._meshes[name]
        if name == WORLD_MESH:
            return MeshInfo(self.rank, self.world_size, True)
        raise KeyError(
            f"{type(self).__name__} on rank {self.rank} has no mesh {name!r}; "
            f"registered meshes: {[WORLD_MESH, *self._meshes]}"
        )
