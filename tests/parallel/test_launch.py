"""run_ranks: the ranks meet at a store the calling process hosts, bound before they start, so no other
process can take the group's port between its choice and the group's start."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist

from hybridflow.parallel import launch


def _rank_sum_and_port_held(rank: int, world_size: int) -> tuple[int, float, bool]:
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    with socket.socket() as probe:
        held = probe.connect_ex((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))) == 0
    return rank, float(value), held


def test_the_ranks_meet_at_the_callers_store(monkeypatch):
    hosted: list[dist.TCPStore] = []
    real_hosted_store = launch.hosted_store

    def recorded_hosted_store(*args, **kwargs) -> dist.TCPStore:
        hosted.append(real_hosted_store(*args, **kwargs))
        return hosted[-1]

    monkeypatch.setattr(launch, "hosted_store", recorded_hosted_store)
    assert launch.run_ranks(_rank_sum_and_port_held, 2, timeout_s=120) == [(0, 3.0, True), (1, 3.0, True)]
    # The group's keys are in the caller's store: the ranks registered there, not in one of their own.
    (store,) = hosted
    assert store.num_keys() > 1
