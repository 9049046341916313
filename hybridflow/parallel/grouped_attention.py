"""Masked attention as two explicit matmuls, for bf16/fp16 on CPU.

PyTorch's CPU SDPA sends a masked bf16 call to its flash kernel, which is built for long sequences: on
the short, many-segment calls of this package it is slow, and its backward much more so. Measured on 2
cores (``python benchmarks/bench_grouped_attention.py``, docs/parallel.md): one 256-segment
shared-prefix bucket (8 heads, 2 KV heads, 15 queries against 21 keys, head_dim 32), forward +
backward, 82 ms under the flash kernel, 25 ms under SDPA's math backend, 7.8 ms here; the forward +
backward of a 3.1M model over a 256-row GRPO batch, 0.86 s -> 0.49 s. In fp32 the flash kernel is the
faster one (19 ms against 28 ms for that bucket), so fp32 stays on SDPA.

Here the query heads that share a key/value head are stacked as extra query rows, so the keys and
values are never copied per head; the scores are taken in fp32 for the softmax and cast back for the
second matmul.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["grouped_masked_attention", "prefers_explicit_attention"]


def prefers_explicit_attention(query: torch.Tensor, dropout: float) -> bool:
    """Whether `grouped_masked_attention` is the faster choice for ``query``: bf16 or fp16 on CPU,
    without attention dropout (which it does not implement)."""
    return query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16) and dropout == 0.0


def grouped_masked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """``softmax(query key^T * scaling + mask) value`` with grouped key/value heads.

    Args:
        query: ``[batch, heads, q_len, head_dim]``.
        key, value: ``[batch, kv_heads, kv_len, head_dim]``; ``heads`` is a multiple of ``kv_heads``
            and query head ``h`` reads key/value head ``h // (heads / kv_heads)``, as in SDPA's
            ``enable_gqa``.
        mask: ``[batch or 1, 1, q_len, kv_len]``, bool (True attends) or additive float; ``None``:
            every query sees every key (a decoding step of unpadded rows).
        scaling: multiplies the scores; ``None`` is ``head_dim ** -0.5``.

    Returns ``[batch, heads, q_len, head_dim]`` in ``query``'s dtype. A query that sees no key gets
    the mean of the values (a finite stand-in; SDPA's flash kernel gives zeros there), so only rows
    whose output is discarded may be fully masked.
    """
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    group = heads // kv_heads
    scale = head_dim**-0.5 if scaling is None else scaling
    stacked = query.reshape(batch, kv_heads, group * q_len, head_dim)
    scores = torch.matmul(stacked, key.transpose(-1, -2)).float().mul_(scale)
    scores = scores.view(batch, kv_heads, group, q_len, -1)
    if mask is not None and mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask.unsqueeze(2), torch.finfo(torch.float32).min)
    elif mask is not None:
        scores = scores + mask.unsqueeze(2)
    weights = F.softmax(scores, dim=-1).to(value.dtype).view(batch, kv_heads, group * q_len, -1)
    return torch.matmul(weights, value).view(batch, heads, q_len, head_dim)
