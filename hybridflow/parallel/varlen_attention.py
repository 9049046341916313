"""A varlen attention for packed sequences without flash-attn: one causal SDPA call per sequence.

transformers' ``sdpa`` handles a packed row by building a block-diagonal ``[1, 1, T, T]`` mask, so the
kernel still computes all ``T^2`` scores of the packed row and takes the slower masked path. This
implementation reads the sequence boundaries from ``cu_seq_lens_q`` (the flash-attn varlen kwargs that
:func:`hybridflow.parallel.packed_log_probs` passes) and attends within each sequence with
``is_causal=True``: ``sum(len_i^2)`` scores, the unmasked fast kernel, and grouped-query attention
without repeating the keys. Without those kwargs (padded batches, generation) it is plain ``sdpa``.

Select it with ``model.set_attn_implementation(VARLEN_SDPA)``; importing ``hybridflow.parallel``
registers it with transformers.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

VARLEN_SDPA = "hybridflow_varlen_sdpa"


def varlen_sdpa_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    sliding_window: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query [1, heads, T, head_dim]`` against ``key/value [1, kv_heads, T, head_dim]``.

    Returns ``[1, T, heads, head_dim]`` as transformers' attention functions do. With ``cu_seq_lens_q``
    (``[num_seqs + 1]`` offsets into the packed row) ``attention_mask`` is ignored: the sequences are
    the mask.
    """
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if sliding_window is not None:
        raise NotImplementedError(f"{VARLEN_SDPA} does not implement sliding-window attention")
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one row, got batch {query.shape[0]}")
    gqa = key.shape[1] != query.shape[1]
    bounds = cu_seq_lens_q.tolist()
    pieces = [
        F.scaled_dot_product_attention(
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            dropout_p=dropout,
            scale=scaling,
            is_causal=True,
            enable_gqa=gqa,
        )
        for start, end in itertools.pairwise(bounds)
        if end > start
    ]
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
# Padded calls need the same masks as sdpa.
AttentionMaskInterface.register(VARLEN_SDPA, sdpa_mask)


def training_attn_implementation(device_type: str) -> str:
    """The attention to train with packed sequences: flash-attn varlen on CUDA when installed, else ours."""
    if device_type == "cuda":
        try:
            import flash_attn  # noqa: F401
        except ImportError:
            return VARLEN_SDPA
        return "flash_attention_2"
    return VARLEN_SDPA
