"""The store a process group meets at, hosted by one of its members.

A member that hosts the store binds it on a port the OS assigns as it binds (``port`` 0) and hands that
port to the others, who connect. Nothing picks a free port first and binds it later, so no other process
can take the port in between. Used by Ray worker groups (`hybridflow.controller.host.WorkerHost`, rank 0
hosts) and by the weight group of a split rollout (`hybridflow.resharding.transport`, the sender hosts).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

__all__ = ["hosted_store"]


def hosted_store(address: str, world_size: int, timeout_s: float = 1800.0) -> dist.TCPStore:
    """A `TCPStore` hosted by this process, listening on ``address`` at the port the OS assigned
    (``.port``, for the other ``world_size - 1`` members to connect to)."""
    return dist.TCPStore(
        address, 0, world_size, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
