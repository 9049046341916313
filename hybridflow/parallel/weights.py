"""Streaming the full weights out of an FSDP2 model, one tensor at a time, under HF names.

This feeds the inference engine's weight reload: peak extra memory is one full tensor (or one bucket),
never a full copy of the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from hybridflow.parallel.checkpointing import CHECKPOINT_PREFIX
from hybridflow.parallel.fsdp import reshard_all

# Segments that wrappers insert into parameter names: activation checkpointing and torch.compile.
_WRAPPER_SEGMENTS = (CHECKPOINT_PREFIX, "_orig_mod.")


def hf_param_name(fqn: str) -> str:
    """The name the unwrapped HF model's ``state_dict()`` uses for the wrapped model's ``fqn``."""
    for segment in _WRAPPER_SEGMENTS:
        fqn = fqn.replace(segment, "")
    return fqn


def iter_full_state(
    model: nn.Module, *, dtype: torch.dtype | None = None, skip_tied: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(hf_name, full_tensor)`` for every entry of ``model.state_dict()``, in its order.

    A collective when ``model`` is sharded: every rank of the FSDP mesh must consume the iterator to
    the end, in step, because each DTensor is all-gathered when it is reached. Plain tensors (buffers,
    unsharded models) are yielded as they are. ``dtype`` casts each full tensor (e.g. bf16 for an engine
    that runs in bf16), halving what is sent. A tensor tied to an earlier entry (``lm_head.weight`` tied
    to ``model.embed_tokens.weight``) is gathered again rather than cached, so that at most one full
    tensor is alive at a time; ``skip_tied=True`` leaves such entries out, for consumers that re-tie.
    """
    reshard_all(model)
    seen: set[int] = set()
    for fqn, value in model.state_dict(keep_vars=True).items():
        # keep_vars gives the Parameter objects themselves, so a tied entry is the same object twice.
        if id(value) in seen and skip_tied:
            continue
        seen.add(id(value))
        with torch.no_grad():
            full = value.full_tensor() if isinstance(value, DTensor) else value.detach()
        if dtype is not None and full.is_floating_point():
            full = full.to(dtype)
        yield hf_param_name(fqn), full


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Size of ``tensor``'s elements in bytes."""
    return tensor.numel() * tensor.element_size()


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group a stream of named tensors into lists of total size at most ``bucket_bytes`` (bytes).

    Order is kept. A tensor larger than ``bucket_bytes`` cannot be split and comes alone in its own
    bucket. Only the current bucket is held, plus the tensor that opens the next one (it is read
    before the current bucket is yielded). `hybridflow.resharding.streaming.WeightStreamer` streams through
    one reused buffer instead.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket
