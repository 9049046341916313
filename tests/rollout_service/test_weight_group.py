"""The weight group's bucketed broadcast between two pools of Ray processes (gloo on CPU, NCCL on GPU).

A sender pool of 2 ranks (rank 0 sends, rank 1 has no group, as the actor's other ranks) and a receiver
pool of 2 ranks. The weights mix dtypes and sizes so that buckets hold several tensors at aligned
offsets, a tensor larger than the bucket travels alone, and a bucket boundary falls between tensors; every
receiver must get every tensor bit for bit, in order, under the pushed version.
"""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import (
    ResourcePool,
    RoleSpec,
    Worker,
    create_worker_groups,
    register,
    wait_together,
)
from hybridflow.parallel.rendezvous import hosted_store
from hybridflow.resharding.transport import (
    BroadcastReceiver,
    BroadcastSender,
    open_weight_group,
)

BUCKET_BYTES = 1024


def weights(version: int) -> list[tuple[str, torch.Tensor]]:
    """Deterministic named tensors of several dtypes; one (2048 bytes) larger than a bucket."""
    generator = torch.Generator().manual_seed(version)
    return [
        ("a.weight", torch.randn(7, 5, generator=generator)),
        ("b.bias", torch.randn(3, generator=generator).to(torch.bfloat16)),
        ("big.weight", torch.randn(16, 32, generator=generator)),
        ("c.index", torch.arange(9, dtype=torch.int64) * version),
        ("d.weight", torch.randn(60, generator=generator).to(torch.float16)),
        ("e.scalar", torch.tensor(float(version))),
    ]


class Sender(Worker):
    @register(dispatch="one_to_all", execute="rank_zero")
    def address(self, world_size: int) -> tuple[str, int]:
        self.store = hosted_store(self.master_addr, world_size)
        return self.master_addr, self.store.port

    @register(dispatch="one_to_all", blocking=False)
    def join(self, address: str, port: int, world_size: int) -> None:
        group = open_weight_group(address, port, 0, world_size, self.device, hosted=self.store) if self.rank == 0 else None
        self.sender = BroadcastSender(group, BUCKET_BYTES, self.device)

    @register(dispatch="one_to_all", blocking=False)
    def push(self, version: int) -> dict[str, float]:
        self.sender.version = version
        self.sender.update_weights((name, t.to(self.device)) for name, t in weights(version))
        return self.sender.reports[-1].metrics() if self.rank == 0 else {}


class Receiver(Worker):
    @register(dispatch="one_to_all", blocking=False)
    def join(self, address: str, port: int, world_size: int) -> None:
        self.receiver = BroadcastReceiver(open_weight_group(address, port, 1 + self.rank, world_size, self.device), self.device)

    @register(dispatch="one_to_all", blocking=False)
    def pull(self) -> tuple[int | None, list[tuple[str, torch.Tensor]]]:
        got = [(name, tensor.cpu().clone()) for name, tensor in self.receiver.receive()]
        return self.receiver.version, got


@pytest.fixture(scope="module")
def pools(ray_cluster):
    placement = {
        "sender": ResourcePool([2], cpus_per_slot=0.5, name="senders"),
        "receiver": ResourcePool([2], cpus_per_slot=0.5, name="receivers"),
    }
    groups = create_worker_groups({"sender": RoleSpec(Sender), "receiver": RoleSpec(Receiver)}, placement)
    sender, receiver = groups["sender"], groups["receiver"]
    address, port = sender.address(3)[0]
    wait_together([sender.join(address, port, 3), receiver.join(address, port, 3)])
    yield sender, receiver
    for group in groups.values():
        group.hosts.shutdown()
    for pool in placement.values():
        pool.release()


@pytest.mark.parametrize("version", [3, 4])
def test_every_receiver_gets_every_tensor_under_the_version(pools, version):
    sender, receiver = pools
    sent, received = wait_together([sender.push(version), receiver.pull()])
    expected = weights(version)
    for rank_version, got in received:
        assert rank_version == version
        assert [name for name, _ in got] == [name for name, _ in expected]
        for (name, value), (_, want) in zip(got, expected, strict=True):
            assert value.dtype == want.dtype and value.shape == want.shape, name
            assert torch.equal(value, want), name
    report = sent[0]
    total = sum(t.numel() * t.element_size() for _, t in expected)
    assert report["weight_push/mb"] * 2**20 == total
    assert report["weight_push/version"] == version
    # 4 small tensors before "big" go in bucket 1 (140 + 6 + ... bytes), "big" alone (2048 > 1024 bytes),
    # the remaining three in a third bucket.
    assert report["weight_push/buckets"] == 3


@pytest.mark.skipif(
    torch.cuda.device_count() < 2,
    reason=f"the NCCL weight group needs 2 CUDA devices (sender and engine); this machine has {torch.cuda.device_count()}",
)
def test_nccl_weight_group_between_gpu_pools(ray_cluster):
    placement = {
        "sender": ResourcePool([1], use_gpu=True, name="gpu-senders"),
        "receiver": ResourcePool([1], use_gpu=True, name="gpu-receivers"),
    }
    groups = create_worker_groups({"sender": RoleSpec(Sender), "receiver": RoleSpec(Receiver)}, placement)
    try:
        sender, receiver = groups["sender"], groups["receiver"]
        address, port = sender.address(2)[0]
        wait_together([sender.join(address, port, 2), receiver.join(address, port, 2)])
        _, received = wait_together([sender.push(5), receiver.pull()])
        version, got = received[0]
        assert version == 5
        for (name, value), (_, want) in zip(got, weights(5), strict=True):
            assert torch.equal(value, want), name
    finally:
        for group in groups.values():
            group.hosts.shutdown()
        for pool in placement.values():
            pool.release()
