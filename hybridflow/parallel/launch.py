"""`run_ranks`: run a function on the ranks of a fresh local process group and collect each rank's result.

For single-machine SPMD jobs without Ray (tests, benchmarks): each rank is a spawned process that
joins a group over 127.0.0.1 before calling the function, with the backend of its `DevicePlan` (gloo
for CPU ranks, nccl for GPU ranks, each of which then sees only its own GPU, as device 0). The group
meets at a store the calling process hosts (`hybridflow.parallel.rendezvous.hosted_store`), bound
before any rank starts, so no other process can take its port. The group is never destroyed in the
ranks, because a vLLM engine built inside it must live until its process ends.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["run_ranks"]

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.parallel.device import local_device_plan
from hybridflow.parallel.rendezvous import hosted_store

ADDRESS = "127.0.0.1"
"""Where the group's store listens and the ranks connect: this machine only."""


def _visible_gpus(world_size: int) -> list[str]:
    """The GPU id each rank is given, from this process's visible GPUs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        ids = [str(i) for i in range(torch.cuda.device_count())]
    else:
        ids = [i for i in visible.split(",") if i]
    if len(ids) < world_size:
        raise ValueError(f"run_ranks(use_gpu=True) needs {world_size} GPUs, this process sees {len(ids)}")
    return ids[:world_size]


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    gpu: str | None,
    fn: Callable[..., Any],
    args: tuple,
    queue: Any,
    timeout_s: float,
) -> None:
    # The environment names the group for code in ``fn`` that reads it, as under torchrun.
    os.environ.update(MASTER_ADDR=ADDRESS, MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    if gpu is not None:
        # Before CUDA initialises in this process: the rank's GPU becomes its device 0, as under Ray.
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    try:
        plan = local_device_plan(gpu is not None)
        if plan.device.type == "cuda":
            torch.cuda.set_device(plan.device)
        store = dist.TCPStore(
            ADDRESS, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s)
        )
        dist.init_process_group(plan.backend, store=store, rank=rank, world_size=world_size)
        queue.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
        raise
    # A normal exit spends 5-10 s in vLLM's shutdown (a full garbage collection of the unfrozen heap);
    # once the result is flushed to the parent there is nothing left worth waiting for.
    queue.close()
    queue.join_thread()
    os._exit(0)


def run_ranks(
    fn: Callable[..., Any], world_size: int, *args: Any, use_gpu: bool = False, timeout_s: float = 300
) -> list[Any]:
    """``[fn(rank, world_size, *args) for each rank]``, each rank in its own spawned process.

    ``fn`` runs inside an initialised process group and returns something picklable: gloo on CPU
    ranks; with ``use_gpu`` nccl, rank ``r`` owning this process's ``r``-th visible GPU (as its
    ``cuda:0``). A rank that raises fails the call with that rank's traceback; processes still running
    after ``timeout_s`` are killed. The group is not destroyed: a vLLM engine inside it must live until
    the process ends. The group's store lives in this process, on a port bound before the ranks start.
    """
    gpus: list[str | None] = list(_visible_gpus(world_size)) if use_gpu else [None] * world_size
    store = hosted_store(ADDRESS, world_size + 1, timeout_s)  # the ranks, and this process as its host
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [
        context.Process(
            target=_rank_main,
            args=(rank, world_size, store.port, gpus[rank], fn, args, queue, timeout_s),
            daemon=True,
        )
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, value = queue.get(timeout=timeout_s)
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            results[rank] = value
        for process in processes:
            process.join(timeout=60)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    return [results[rank] for rank in range(world_size)]
