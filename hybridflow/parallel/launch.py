"""`run_ranks`: run a function on the ranks of a fresh local gloo group and collect each rank's result.

For single-machine SPMD jobs without Ray (tests, benchmarks): each rank is a spawned process that
joins a gloo group over 127.0.0.1 before calling the function. The group is never destroyed in the
ranks, because a vLLM engine built inside it must live until its process ends.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["run_ranks"]

import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        queue.put((rank, "ok", fn(rank, world_size, *args)))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
        raise
    # A normal exit spends 5-10 s in vLLM's shutdown (a full garbage collection of the unfrozen heap);
    # once the result is flushed to the parent there is nothing left worth waiting for.
    queue.close()
    queue.join_thread()
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 300) -> list[Any]:
    """``[fn(rank, world_size, *args) for each rank]``, each rank in its own spawned process.

    ``fn`` runs inside an initialised gloo group and returns something picklable. A rank that raises
    fails the call with that rank's traceback; processes still running after ``timeout_s`` are killed.
    The group is not destroyed: a vLLM engine inside it must live until the process ends.
    """
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [
        context.Process(target=_rank_main, args=(rank, world_size, port, fn, args, queue), daemon=True)
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
