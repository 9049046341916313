"""Streaming FSDP2 parameters into an engine through one reused gather buffer.

`iter_full_state` allocates a fresh full tensor per parameter. Fed to an engine bucket by bucket,
that costs an allocation (and on CPU, page faults) for every byte streamed, every switch, and the
freed memory either stays resident or has to be handed back and faulted in again. `WeightStreamer`
instead all-gathers each parameter straight into a slot of one preallocated buffer of
``bucket_bytes`` and hands the engine that slot; the buffer is used as a ring, so after the first
pass no new memory is touched.

A slot is only overwritten once the engine has let go of the tensor it was given. Engines may keep
tensors for a while (vLLM's in-place reload keeps every incoming tensor of a fused layer, e.g.
q/k/v, until the layer is complete, and an embedding padded to a vocabulary multiple until the
end): each yielded tensor is weakly referenced, and the ring steps over slots whose tensor is still
alive. Only when no free stretch is left does it leave the buffer to the engine (freed when the
engine drops its last tensor) and start a fresh one; `retired_buffers` counts those. The yielded tensors own their storage reference directly (they are not views), so a view the
engine derives from one keeps it, and its slot, alive.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from hybridflow.parallel.fsdp import reshard_all
from hybridflow.parallel.weights import hf_param_name, tensor_bytes

__all__ = ["WeightStreamer"]

# Newer torch builds rename all_gather_into_tensor (and warn on the old name); older ones lack the new name.
_all_gather_single = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

# Slots start on this many bytes, so any dtype can view them.
_ALIGN = 64


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


@dataclass
class _Slot:
    start: int
    end: int
    tensor: weakref.ref[torch.Tensor]

    def overlaps(self, start: int, end: int) -> bool:
        return start < self.end and self.start < end and self.tensor() is not None


def _gather_rows(value: DTensor) -> int:
    """Rows of the all-gathered, padded dim 0 of a dim-0-sharded DTensor (FSDP2 pads to world)."""
    world = value.device_mesh.size()
    return -(-value.shape[0] // world) * world


def _is_dim0_sharded(value: torch.Tensor) -> bool:
    return (
        isinstance(value, DTensor)
        and value.device_mesh.ndim == 1
        and len(value.placements) == 1
        and value.placements[0] == Shard(0)
        and value.dim() > 0
    )


class WeightStreamer:
    """Yields ``(hf_name, full_tensor)`` for every ``state_dict`` entry of an FSDP2 model.

    A collective: every rank of the FSDP mesh must drain each `stream` in step. Entries that are not
    sharded (buffers, replicated parameters) are yielded as they are, without a copy.

    Args:
        capacity_bytes: size of the gather buffer (the most gathered bytes held at once by the
            streamer, outside buffers the engine still holds). A tensor larger than it gets a buffer
            of its own size.
        device: where the buffer lives (the training device).
        dtype: cast each tensor to this dtype (the engine's) before gathering, or keep it.

    Attributes (measured over the last `stream`):
        bytes_streamed: bytes of full tensors yielded.
        buffers_allocated: gather buffers allocated (1 when the ring never had to be abandoned).
        retired_buffers: buffers left to the engine because it still held a slot that was due.
    """

    def __init__(self, capacity_bytes: int, device: torch.device, dtype: torch.dtype | None = None) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.device = device
        self.dtype = dtype
        self.bytes_streamed = 0
        self.buffers_allocated = 0
        self.retired_buffers = 0
        self._buffer: torch.Tensor | None = None
        self._slots: list[_Slot] = []
        self._offset = 0

    def stream(self, model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The model's full weights under Hugging Face names, in ``state_dict`` order.

        The gather buffer lives until the iterator is exhausted (or closed) and is then dropped.
        """
        self.bytes_streamed = self.buffers_allocated = self.retired_buffers = 0
        reshard_all(model)
        try:
            for fqn, value in model.state_dict(keep_vars=True).items():
                with torch.no_grad():
                    full = self._gather(value) if _is_dim0_sharded(value) else self._unsharded(value)
                self.bytes_streamed += tensor_bytes(full)
                yield hf_param_name(fqn), full
                del full
        finally:
            self._buffer, self._slots, self._offset = None, [], 0

    def stream_packed(
        self, model: nn.Module, select: Callable[[str], bool]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The entries whose Hugging Face name ``select`` keeps (the same test on every rank: the LoRA
        adapters, `hybridflow.lora.is_adapter_name`), as `stream` gives them, gathered by one collective.

        For many small tensors (LoRA adapters: two per adapted layer) a push is bound by the latency of
        one all-gather per tensor, not by bytes. Here every rank packs its shards of all selected
        tensors into one flat buffer, one all-gather brings every rank's buffer, and each full tensor
        is cut out of it (a copy of its own). Costs ``world`` times the packed shards once, plus the
        copies: meant for a small selection, not for the whole model.
        """
        self.bytes_streamed = self.buffers_allocated = self.retired_buffers = 0
        reshard_all(model)
        entries = [(fqn, v) for fqn, v in model.state_dict(keep_vars=True).items() if select(hf_param_name(fqn))]
        with torch.no_grad():
            gathered = iter(self._gather_packed([v for _, v in entries if _is_dim0_sharded(v)]))
            for fqn, value in entries:
                full = next(gathered) if _is_dim0_sharded(value) else self._unsharded(value)
                self.bytes_streamed += tensor_bytes(full)
                yield hf_param_name(fqn), full

    def _gather_packed(self, values: list[DTensor]) -> list[torch.Tensor]:
        """The full tensors of dim-0-sharded ``values`` (one mesh, one dtype after the cast) from one
        all-gather of their packed local shards."""
        if not values:
            return []
        world = values[0].device_mesh.size()
        pieces = []
        for value in values:
            local = value.to_local()
            if self.dtype is not None and local.is_floating_point():
                local = local.to(self.dtype)
            per_rank = _gather_rows(value) // world
            padded = local.new_zeros((per_rank, *local.shape[1:]))
            padded[: local.shape[0]] = local
            pieces.append(padded.reshape(-1))
        if len({piece.dtype for piece in pieces}) > 1:
            raise ValueError("stream_packed: the selected tensors must share one dtype")
        packed = torch.cat(pieces)
        out = packed.new_empty(world * packed.numel())
        _all_gather_single(out, packed, group=values[0].device_mesh.get_group())
        self.buffers_allocated += 1
        ranks = out.view(world, packed.numel())
        fulls, offset = [], 0
        for value, piece in zip(values, pieces, strict=True):
            rows = _gather_rows(value)
            block = ranks[:, offset : offset + piece.numel()].reshape(rows, *value.shape[1:])
            fulls.append(block[: value.shape[0]].clone())
            offset += piece.numel()
        return fulls

    def _unsharded(self, value: torch.Tensor) -> torch.Tensor:
        full = value.full_tensor() if isinstance(value, DTensor) else value.detach()
        if self.dtype is not None and full.is_floating_point():
            full = full.to(self.dtype)
        return full

    def _gather(self, value: DTensor) -> torch.Tensor:
        local = value.to_local()
        if self.dtype is not None and local.is_floating_point():
            local = local.to(self.dtype)
        rows = _gather_rows(value)
        world = value.device_mesh.size()
        per_rank = rows // world
        if local.shape[0] != per_rank:
            # FSDP2 shards unevenly (torch.chunk); the collective needs equal pieces.
            padded = local.new_zeros((per_rank, *local.shape[1:]))
            padded[: local.shape[0]] = local
            local = padded
        shape = (rows, *value.shape[1:])
        out = self._slot(shape, local.dtype)
        _all_gather_single(out, local.contiguous(), group=value.device_mesh.get_group())
        # Hand out a new tensor of the true shape that owns the storage reference (not a view), and
        # watch that one, not ``out``: the collective's work object can hold ``out`` after the call
        # returns, until its worker thread gets round to dropping it (with gloo under load, about one
        # call in eight), and that would make the slot look taken by the engine.
        handed = torch.empty(0, dtype=out.dtype, device=out.device)
        handed.set_(out.untyped_storage(), out.storage_offset(), value.shape, out.stride())
        if self._slots and self._slots[-1].tensor() is out:  # a ring slot, not an own allocation
            self._slots[-1].tensor = weakref.ref(handed)
        return handed

    def _slot(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = _aligned(torch.Size(shape).numel() * dtype.itemsize)
        if nbytes > self.capacity_bytes:
            self.buffers_allocated += 1
            return torch.empty(shape, dtype=dtype, device=self.device)
        if self._buffer is None:
            self._new_buffer()
        start = self._free_start(nbytes)
        if start is None:
            self.retired_buffers += 1
            self._new_buffer()
            start = 0
        end = start + nbytes
        assert self._buffer is not None
        tensor = torch.empty(0, dtype=dtype, device=self.device)
        tensor.set_(self._buffer.untyped_storage(), start // tensor.element_size(), shape)
        self._slots.append(_Slot(start, end, weakref.ref(tensor)))
        self._offset = end
        return tensor

    def _free_start(self, nbytes: int) -> int | None:
        """First offset from the ring's position (wrapping once) where ``nbytes`` overlap no live slot."""
        self._slots = [slot for slot in self._slots if slot.tensor() is not None]
        start, wrapped = self._offset, False
        while True:
            if start + nbytes > self.capacity_bytes:
                if wrapped:
                    return None
                start, wrapped = 0, True
            blocking = [slot for slot in self._slots if slot.overlaps(start, start + nbytes)]
            if not blocking:
                return start
            start = max(slot.end for slot in blocking)
            if wrapped and start >= self._offset:
                return None

    def _new_buffer(self) -> None:
        self._buffer = torch.empty(self.capacity_bytes, dtype=torch.uint8, device=self.device)
        self._slots, self._offset = [], 0
        self.buffers_allocated += 1
