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
from hybridflow.parallel.rendezvous import hosted_store
from hybridflow.parallel.threads import set_this_thread_torch_threads

__all__ = ["WorkerHost"]


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

    def rendezvous_address(self, timeout_s: float) -> tuple[str, int]:
        """Rank 0 only: host the group's store on this node (`hosted_store`: bound before its port is
        handed out) and return this node's IP and that port, the rendezvous point of the group's
        `init_distributed`."""
        address = socket.gethostbyname(socket.gethostname())
        self.store = hosted_store(address, self.world_size, timeout_s)
        return address, self.store.port

    def init_distributed(self, master_addr: str, master_port: int, timeout_s: float) -> int:
        """Install the worker context and join the group's process group (collective) at the store rank
        0 hosts (`rendezvous_address`)."""
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
        timeout = timedelta(seconds=timeout_s)
        store = self.store if self.rank == 0 else dist.TCPStore(master_addr, master_port, self.world_size, timeout=timeout)
        dist.init_process_group(
            backend=context.backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout
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
