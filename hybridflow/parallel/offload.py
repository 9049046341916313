"""Moving training state off the accelerator between phases, and back.

Before generation the rollout needs the device memory the trainer holds: AdamW's ``exp_avg`` and
``exp_avg_sq`` (2x the sharded parameters in fp32), the sharded parameters and their gradients. The
functions here move that state to host memory and back and report what they moved. On a CPU-only
machine the moves are no-ops (``bytes_moved == 0``), but dropping gradients still frees memory.

Why the GPU path looks the way it does: freed CUDA blocks stay in PyTorch's caching allocator, where the
inference engine (which sizes its KV cache from the *free* device memory) cannot see them, so every
offload ends with ``torch.cuda.empty_cache()``. Device-to-host copies are issued non-blocking and
synchronised once, rather than one synchronisation per tensor.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from hybridflow.parallel.fsdp import reshard_all


@dataclass(frozen=True)
class TransferStats:
    """What a move touched. Sizes are this rank's local shards, in bytes; ``seconds`` is wall time."""

    tensors: int
    bytes_total: int
    bytes_moved: int
    seconds: float


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of this rank's part of ``tensor``: its local shard for a DTensor (FSDP2), else all of it."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def _finish_transfer(devices: Iterable[torch.device]) -> None:
    # A non-blocking device-to-host copy is only valid once the stream has caught up.
    if any(d.type == "cuda" for d in devices):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _step_stays_on_host(group: dict) -> bool:
    # torch optimizers keep the scalar step count on the CPU unless capturable/fused, and refuse a
    # device step otherwise.
    return not (group.get("capturable") or group.get("fused"))


def _move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> TransferStats:
    start = time.perf_counter()
    tensors = bytes_total = bytes_moved = 0
    touched: set[torch.device] = set()
    for group in optimizer.param_groups:
        keep_step_on_host = _step_stays_on_host(group)
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                target = torch.device("cpu") if key == "step" and keep_step_on_host else device
                nbytes = local_bytes(value)
                tensors += 1
                bytes_total += nbytes
                if value.device != target:
                    touched.update((value.device, target))
                    state[key] = value.to(target, non_blocking=True)
                    bytes_moved += nbytes
    _finish_transfer(touched)
    return TransferStats(tensors, bytes_total, bytes_moved, time.perf_counter() - start)


def offload_optimizer_state(optimizer: torch.optim.Optimizer) -> TransferStats:
    """Move every optimizer state tensor (``exp_avg``, ``exp_avg_sq``, ...) to host memory."""
    return _move_optimizer_state(optimizer, torch.device("cpu"))


def load_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | str) -> TransferStats:
    """Move the optimizer state back to ``device`` (the scalar ``step`` stays where torch wants it)."""
    return _move_optimizer_state(optimizer, torch.device(device))


def free_gradients(model: nn.Module) -> int:
    """Drop all parameter gradients (``grad = None``) and return the bytes released."""
    freed = 0
    for param in model.parameters():
        if param.grad is not None:
            freed += local_bytes(param.grad)
            param.grad = None
    return freed


def _move_module(model: nn.Module, device: torch.device) -> TransferStats:
    start = time.perf_counter()
    # Gathered (unsharded) weights are transient copies: free them instead of moving them.
    reshard_all(model)
    tensors = bytes_total = bytes_moved = 0
    touched: set[torch.device] = set()
    for tensor in _param_and_grad_tensors(model):
        nbytes = local_bytes(tensor)
        tensors += 1
        bytes_total += nbytes
        if tensor.device != device:
            touched.update((tensor.device, device))
            bytes_moved += nbytes
    # FSDP2 overrides Module._apply so that .to() re-registers the sharded parameters it moved.
    model.to(device, non_blocking=True)
    _finish_transfer(touched)
    return TransferStats(tensors, bytes_total, bytes_moved, time.perf_counter() - start)


def _param_and_grad_tensors(model: nn.Module) -> Iterable[torch.Tensor]:
    for param in model.parameters():
        yield param
        if param.grad is not None:
            yield param.grad
    yield from model.buffers()


def offload_fsdp_params(model: nn.Module, *, keep_grads: bool = False) -> tuple[TransferStats, int]:
    """Move the (sharded) parameters and buffers of ``model`` to host memory.

    Gradients are dropped unless ``keep_grads`` (then they move with their parameters): after the
    optimizer step they carry nothing the next phase needs. Returns the transfer stats and the bytes of
    gradients freed.
    """
    freed = 0 if keep_grads else free_gradients(model)
    return _move_module(model, torch.device("cpu")), freed


def load_fsdp_params(model: nn.Module, device: torch.device | str) -> TransferStats:
    """Move the parameters (and any kept gradients) and buffers of ``model`` back to ``device``."""
    return _move_module(model, torch.device(device))
