"""A vLLM CPU worker whose shared-memory segments are named per job.

vLLM's CPU build exchanges tensor-parallel data through POSIX shared memory named
``{ident}-{group}-[{ranks}]-cpushm``, where ``ident`` comes from the worker's distributed init method.
Under ``external_launcher`` that method is ``env://`` for every job, so ``ident`` is empty and two jobs
on one host (or a stale segment left by a killed run) collide and fail the start with ``errno: 17``.
This worker draws a fresh identifier on rank 0, shares it with every rank, and hands vLLM an init
method whose basename is that identifier. The process group already exists when the engine starts
(the engine requires it), so vLLM uses the init method for nothing else.

vLLM imports this class by its qualified name (``worker_cls``); importing the module imports vLLM.
"""

from __future__ import annotations

import contextlib
import os
import uuid

import torch.distributed as dist
from vllm.v1.worker.cpu_worker import CPUWorker

__all__ = ["JobScopedShmCPUWorker"]

_SHM_DIR = "/dev/shm"


def _job_identifier() -> str:
    identifier = [f"hybridflow-{os.getpid()}-{uuid.uuid4().hex[:12]}"]
    # Rank 0's choice reaches every rank; all ranks of the world start their engines together.
    dist.broadcast_object_list(identifier, src=0)
    return identifier[0]


class JobScopedShmCPUWorker(CPUWorker):
    """``CPUWorker`` with shared-memory names unique to this job."""

    def init_device(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError("JobScopedShmCPUWorker needs an initialised torch.distributed process group")
        identifier = _job_identifier()
        # vLLM takes the basename of a file:// init method as the shared-memory name prefix.
        self.distributed_init_method = f"file://{identifier}"
        super().init_device()
        # Every rank has mapped its group's segments by now (vLLM joins them behind barriers), so the
        # names can go: the mappings stay valid, and a killed job leaves nothing behind in /dev/shm.
        for name in os.listdir(_SHM_DIR):
            if name.startswith(identifier):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(_SHM_DIR, name))
