"""`WorkerHost`: the process behind one device slot. It runs as a Ray actor.

A host joins its group's ``torch.distributed`` process group once, then holds any number of role
objects (colocation): the controller creates roles by name and calls their methods through
`WorkerHost.execute`. Arguments arrive as top-level call arguments, so Ray resolves object
references among them inside this process: chained outputs never pass through the controller.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.controller.worker import MeshInfo, Worker, WorkerContext, install_context
from hybridflow.parallel.threads import set_this_thread_torch_threads

__all__ = ["WorkerHost"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class WorkerHost:
    """Holds the colocated role objects of one rank.

    ``torch_threads`` is how many threads torch computes with in the process's main thread, where the
    roles run (`hybridflow.parallel.threads`: other threads keep the process default).
    """

    def __init__(
        self, rank: int, world_size: int, local_rank: int, use_gpu: bool, torch_threads: int
    ) -> None:
        set_this_thread_torch_threads(torch_threads)
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.use_gpu = use_gpu
        self.roles: dict[str, Worker] = {}

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP and a free port, for rank 0 to offer as the group's rendezvous point."""
        return socket.gethostbyname(socket.gethostname()), _free_port()

    def init_distributed(self, master_addr: str, master_port: int, timeout_s: float) -> int:
        """Install the worker context and join the group's process group (collective)."""
        context = WorkerContext(
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            master_addr=master_addr,
            master_port=master_port,
            use_gpu=self.use_gpu,
        )
        install_context(context)
        if self.use_gpu:
            torch.cuda.set_device(context.device)
        dist.init_process_group(
            backend=context.backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        return os.getpid()

    def create_role(self, role: str, cls: type[Worker], args: tuple, kwargs: dict) -> None:
        if role in self.roles:
            raise ValueError(f"role {role!r} already exists on rank {self.rank}")
        self.roles[role] = cls(*args, **kwargs)

    def execute(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.roles[role], method)(*args, **kwargs)

    def mesh_info(self, role: str, name: str) -> MeshInfo:
        return self.roles[role].mesh_info(name)
