"""Device meshes of a worker group: one for the training layout, one for the inference layout.

Both meshes cover the same ranks. The training mesh is 1-d (FSDP2 shards over every rank). The inference
mesh is 2-d, ``dp x tp``: ranks ``[d * tp, (d + 1) * tp)`` form tensor-parallel group ``d``, which is how
the inference engine lays out its TP groups (consecutive ranks, so a TP group stays inside one node).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hybridflow.parallel.device import process_group_device_plan

TRAIN_DIM = "fsdp"
DP_DIM = "dp"
TP_DIM = "tp"


def data_parallel_size(world_size: int, tp_size: int) -> int:
    """Number of data-parallel groups of the inference layout; raises ``ValueError`` on a bad split."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if world_size % tp_size != 0:
        raise ValueError(
            f"tp_size={tp_size} does not divide world_size={world_size}: the inference layout needs "
            f"world_size = dp_size * tp_size (valid tp sizes: "
            f"{[t for t in range(1, world_size + 1) if world_size % t == 0]})"
        )
    return world_size // tp_size


@dataclass(frozen=True)
class DpRankInfo:
    """Where one rank sits in the inference layout.

    ``is_collector`` marks the rank whose outputs the controller keeps for its dp shard: every rank of a
    TP group returns the same result, so only ``tp_rank == 0`` is collected.
    """

    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int

    @property
    def is_collector(self) -> bool:
        return self.tp_rank == 0


def dp_rank_info(rank: int, world_size: int, tp_size: int) -> DpRankInfo:
    """The dp/tp coordinates of ``rank``, computed without a process group (usable on the controller)."""
    dp_size = data_parallel_size(world_size, tp_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    return DpRankInfo(dp_rank=rank // tp_size, dp_size=dp_size, tp_rank=rank % tp_size, tp_size=tp_size)


def mesh_dp_rank_info(infer_mesh: DeviceMesh) -> DpRankInfo:
    """The calling rank's coordinates read from an inference mesh built by :func:`build_meshes`."""
    return DpRankInfo(
        dp_rank=infer_mesh.get_local_rank(DP_DIM),
        dp_size=infer_mesh.size(infer_mesh.mesh_dim_names.index(DP_DIM)),
        tp_rank=infer_mesh.get_local_rank(TP_DIM),
        tp_size=infer_mesh.size(infer_mesh.mesh_dim_names.index(TP_DIM)),
    )


@dataclass(frozen=True)
class ParallelMeshes:
    """The two layouts of one worker group. ``train`` has dim ``"fsdp"``; ``infer`` has ``("dp", "tp")``."""

    train: DeviceMesh
    infer: DeviceMesh

    @property
    def dp_info(self) -> DpRankInfo:
        return mesh_dp_rank_info(self.infer)


def build_meshes(world_size: int, tp_size: int, device_type: str | None = None) -> ParallelMeshes:
    """Build both meshes over the default process group; a collective: every rank must call it.

    ``device_type`` is the worker's (``DevicePlan.device_type``); by default the one its process group
    was built for (`process_group_device_plan`: ``cuda`` under nccl, ``cpu`` under gloo), never what
    the machine happens to have. The sizes are checked before any mesh is created, so a bad
    ``tp_size`` fails the same way on every rank without hanging.
    """
    dp_size = data_parallel_size(world_size, tp_size)
    device_type = device_type or process_group_device_plan().device_type
    train = init_device_mesh(device_type, (world_size,), mesh_dim_names=(TRAIN_DIM,))
    infer = init_device_mesh(device_type, (dp_size, tp_size), mesh_dim_names=(DP_DIM, TP_DIM))
    return ParallelMeshes(train=train, infer=infer)
