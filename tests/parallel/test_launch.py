"""run_ranks on a port taken between its choice and rank 0's listen: the ranks start again on another port
and the results are the uninterrupted call's."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

from hybridflow.parallel import launch


def _rank_sum(rank: int, world_size: int) -> tuple[int, float]:
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return rank, float(value)


def test_a_taken_port_is_replaced_and_the_ranks_run_once(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        chosen: list[int] = []
        real_free_port = launch._free_port

        def first_the_taken_port() -> int:
            chosen.append(busy if not chosen else real_free_port())
            return chosen[-1]

        monkeypatch.setattr(launch, "_free_port", first_the_taken_port)
        assert launch.run_ranks(_rank_sum, 2, timeout_s=120) == [(0, 3.0), (1, 3.0)]
    assert chosen[0] == busy and len(chosen) == 2 and chosen[1] != busy
