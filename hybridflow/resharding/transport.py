"""Weight transport across pools: a bucketed broadcast from the trainer to engines in other processes.

When the rollout engines run in a pool of their own (``resource.placement.rollout``), the colocated
in-process streaming of `ReshardingManager` cannot reach them. A *weight group* is then made for the
purpose: a torch.distributed process group of its own (gloo on CPU, NCCL on GPU) between the training
rank 0 (group rank 0) and every engine rank (group ranks 1..E), rendezvoused through a TCP store that
the training rank 0 hosts. It is separate from each pool's own process group, so the pools may sit on
different Ray nodes.

A push is a sequence of broadcasts from group rank 0:

1. per bucket, a header ``int64 [kind, meta_bytes, data_bytes, version]`` (``kind`` 1: a bucket
   follows; 0: the push is over, ``version`` is the policy version it carried);
2. the bucket's table of contents (name, dtype, shape, byte offset of every tensor), pickled;
3. the bucket's bytes: the tensors packed end to end, each at a 64-byte aligned offset, at most
   ``bucket_bytes`` unless a single tensor is larger (it then travels alone).

`BroadcastSender` stands where the engine stands for a colocated `ReshardingManager`: the manager's
`WeightStreamer` all-gathers each FSDP2 parameter on every training rank, and the sender packs them
into its one reused bucket and broadcasts. `BroadcastReceiver` yields ``(name, tensor)`` pairs
straight out of each received bucket into the engine's ``update_weights``, so the engine loads a
bucket while the next one is on its way; each bucket is a fresh allocation because an engine may
keep the tensors it was handed (vLLM holds q, k, v until the fused layer is complete).
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from hybridflow.resharding.memory import current_memory_bytes

__all__ = [
    "BroadcastReceiver",
    "BroadcastSender",
    "TransportReport",
    "open_weight_group",
]

_ALIGN = 64
_BUCKET, _END = 1, 0


def open_weight_group(
    address: str,
    port: int,
    rank: int,
    world_size: int,
    device: torch.device,
    timeout_s: float = 1800.0,
    hosted: dist.TCPStore | None = None,
) -> dist.ProcessGroup:
    """Join the weight group: ``world_size`` processes, rank 0 the sender.

    The group meets at one store: ``hosted``, when this process hosts it (`hybridflow.parallel.rendezvous.hosted_store`; the trainer's
    rank 0 does), else the one listening at ``address:port``. A collective over the group's members only
    (each pool's default process group is untouched). ``device`` picks the backend: gloo for CPU, NCCL
    for CUDA (every member must agree).
    """
    timeout = timedelta(seconds=timeout_s)
    store = hosted if hosted is not None else dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    store = dist.PrefixStore("hybridflow-weights", store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def _broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


@dataclass
class TransportReport:
    """One push over the weight group, as seen by the sender (group rank 0).

    Attributes:
        version: the policy version pushed.
        seconds: wall time from the first gathered tensor to the end marker.
        bytes_sent: bytes of weights broadcast (padding between tensors excluded).
        buckets: broadcasts of weight bytes.
        bucket_extra_peak_bytes: per bucket, how far memory (RSS on CPU, allocated on GPU) stood above
            its level at the start of the push once the bucket was packed and broadcast.
    """

    version: int
    seconds: float = 0.0
    bytes_sent: int = 0
    buckets: int = 0
    bucket_extra_peak_bytes: list[int] = field(default_factory=list)

    def metrics(self, prefix: str = "weight_push") -> dict[str, float]:
        """``{prefix}/mb``, ``/s``, ``/mb_per_s``, ``/buckets``, ``/bucket_extra_peak_mb`` (the largest
        bucket's) and ``/version``."""
        mb = self.bytes_sent / 2**20
        return {
            f"{prefix}/mb": mb,
            f"{prefix}/s": self.seconds,
            f"{prefix}/mb_per_s": mb / self.seconds if self.seconds > 0 else 0.0,
            f"{prefix}/buckets": float(self.buckets),
            f"{prefix}/bucket_extra_peak_mb": max(self.bucket_extra_peak_bytes, default=0) / 2**20,
            f"{prefix}/version": float(self.version),
        }


class BroadcastSender:
    """The weight group's rank 0: packs ``(name, tensor)`` pairs into buckets and broadcasts them.

    It takes the engine's place in a `ReshardingManager` on the training ranks (``update_weights``,
    ``resume``, ``release``), so the manager's streaming, casting and reports stay as they are. Ranks
    other than the training rank 0 hold a sender without a group: they take part in the manager's
    all-gathers and send nothing.

    Args:
        group: the weight group (`open_weight_group`) on the training rank 0, None on the others.
        bucket_bytes: the reused bucket's size (``resharding.bucket_bytes``).
        device: where buckets live (the training device; CUDA for NCCL).
    """

    trims_host_memory = False
    # The rollout pool's engines hold plain weights: a LoRA actor's push is merged (docs/lora.md).
    takes_adapters = False

    def __init__(self, group: dist.ProcessGroup | None, bucket_bytes: int, device: torch.device) -> None:
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.device = device
        self.version = 0
        self.reports: list[TransportReport] = []

    def resume(self) -> int:
        return 0

    def release(self) -> int:
        return 0

    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Broadcast every pair of ``weights`` under ``self.version``, then the end marker."""
        report = TransportReport(self.version)
        start = time.perf_counter()
        base = current_memory_bytes(self.device)
        bucket = torch.empty(self.bucket_bytes, dtype=torch.uint8, device=self.device) if self.group else None
        table: list[tuple[str, torch.dtype, tuple[int, ...], int]] = []
        used = 0

        def flush(data: torch.Tensor, entries: list, nbytes: int) -> None:
            assert self.group is not None
            meta = torch.frombuffer(bytearray(pickle.dumps(entries)), dtype=torch.uint8).to(self.device)
            header = torch.tensor([_BUCKET, meta.numel(), nbytes, self.version], dtype=torch.int64)
            _broadcast(self.group, header.to(self.device))
            _broadcast(self.group, meta)
            _broadcast(self.group, data[:nbytes])
            report.buckets += 1
            report.bucket_extra_peak_bytes.append(max(0, current_memory_bytes(self.device) - base))

        for name, tensor in weights:
            if self.group is None:
                continue
            raw = _as_bytes(tensor.detach())
            entry = (name, tensor.dtype, tuple(tensor.shape), 0)
            report.bytes_sent += raw.numel()
            if table and used + raw.numel() > self.bucket_bytes:  # full: send it first, keeping the order
                flush(bucket, table, min(used, self.bucket_bytes))
                table, used = [], 0
            if raw.numel() > self.bucket_bytes:
                flush(raw, [entry], raw.numel())
                continue
            assert bucket is not None
            bucket[used : used + raw.numel()].copy_(raw)
            table.append((name, tensor.dtype, tuple(tensor.shape), used))
            used = _aligned(used + raw.numel())
        if self.group is not None:
            if table:
                flush(bucket, table, min(used, self.bucket_bytes))
            end = torch.tensor([_END, 0, 0, self.version], dtype=torch.int64, device=self.device)
            _broadcast(self.group, end)
        report.seconds = time.perf_counter() - start
        self.reports.append(report)

    def send_unchanged(self) -> None:
        """Tell the engines that ``self.version`` is what they already serve: the end marker alone."""
        if self.group is not None:
            end = torch.tensor([_END, 0, 0, self.version], dtype=torch.int64, device=self.device)
            _broadcast(self.group, end)


class BroadcastReceiver:
    """An engine rank of the weight group: turns one push back into ``(name, tensor)`` pairs.

    Args:
        group: the weight group (`open_weight_group`), joined at a rank > 0.
        device: where received buckets live (the engine's device; CUDA for NCCL).
    """

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group = group
        self.device = device
        self.version: int | None = None
        self.bytes_received = 0

    def receive(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The pushed weights, bucket by bucket, until the end marker; ``version`` is then the version
        the push carried. Every pair must be consumed (a collective with the sender)."""
        self.bytes_received = 0
        while True:
            header = torch.empty(4, dtype=torch.int64, device=self.device)
            _broadcast(self.group, header)
            kind, meta_bytes, data_bytes, version = (int(v) for v in header.tolist())
            if kind == _END:
                self.version = version
                return
            meta = torch.empty(meta_bytes, dtype=torch.uint8, device=self.device)
            _broadcast(self.group, meta)
            table = pickle.loads(meta.cpu().numpy().tobytes())
            data = torch.empty(data_bytes, dtype=torch.uint8, device=self.device)
            _broadcast(self.group, data)
            self.bytes_received += data_bytes
            for name, dtype, shape, offset in table:
                nbytes = torch.Size(shape).numel() * dtype.itemsize
                yield name, data[offset : offset + nbytes].view(dtype).view(shape)
