"""The single controller: workers, worker groups, dispatch modes, and the Ray backend.

See ``docs/concepts.md`` for the picture.
"""

from hybridflow.controller.dispatch import (
    DISPATCH_MODES,
    DataParallel,
    DispatchMode,
    RankCall,
    get_dispatch_mode,
    register_dispatch_mode,
)
from hybridflow.controller.errors import WorkerDiedError, WorkerError, WorkerGroupDeadError
from hybridflow.controller.group import GroupFuture, WorkerGroup
from hybridflow.controller.ray_group import (
    RayHostSet,
    RayWorkerGroup,
    RoleSpec,
    create_colocated_worker_groups,
    create_worker_groups,
    shutdown_worker_groups,
    wait_together,
)
from hybridflow.controller.register import register
from hybridflow.controller.resource_pool import ResourcePool
from hybridflow.controller.worker import MeshInfo, Worker, WorkerContext, current_context

__all__ = [
    "DISPATCH_MODES",
    "DataParallel",
    "DispatchMode",
    "GroupFuture",
    "MeshInfo",
    "RankCall",
    "RayHostSet",
    "RayWorkerGroup",
    "ResourcePool",
    "RoleSpec",
    "Worker",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupDeadError",
    "create_colocated_worker_groups",
    "create_worker_groups",
    "current_context",
    "get_dispatch_mode",
    "register",
    "register_dispatch_mode",
    "shutdown_worker_groups",
    "wait_together",
]
