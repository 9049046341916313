"""The stores that groups meet at are bound before their port is handed out: nothing else can take the
port between the pick and the bind (a free port picked first and bound later could be taken by any
process in between, and the group's start would fail)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from hybridflow.controller.host import WorkerHost
from hybridflow.parallel.rendezvous import hosted_store


def _bind(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", port))


def test_the_worker_group_store_holds_its_port_from_the_moment_it_is_offered():
    # The test process keeps its own thread count (the host sets it for the thread it is built in).
    host = WorkerHost(rank=0, world_size=2, local_rank=0, use_gpu=False, torch_threads=torch.get_num_threads())
    address, port = host.rendezvous_address(timeout_s=10)
    assert address and port == host.store.port
    with pytest.raises(OSError):
        _bind(port)


def test_the_weight_group_store_holds_its_port_and_takes_members():
    store = hosted_store("127.0.0.1", world_size=2, timeout_s=10)
    with pytest.raises(OSError):
        _bind(store.port)
    member = dist.TCPStore("127.0.0.1", store.port, 2, is_master=False)
    member.set("version", "3")
    assert store.get("version") == b"3"
