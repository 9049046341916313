"""A varlen attention for packed sequences without flash-attn, built on SDPA.

transformers' ``sdpa`` handles a packed row by building a block-diagonal ``[1, 1, T, T]`` mask, so the
kernel computes all ``T^2`` scores of the packed row on the slower masked path; one SDPA call per
sequence instead pays a fixed cost per call, which dominates for many short sequences. This
implementation reads the sequence boundaries from ``cu_seq_lens_q`` (the flash-attn varlen kwargs that
:func:`hybridflow.parallel.packed_log_probs` passes) and splits the row into runs of consecutive
sequences of at most :data:`GROUP_TOKENS` tokens: a run with one sequence is one unmasked causal call.
A run of several short ones is one call too, in whichever form computes fewer scores: its sequences
gathered into a padded ``[sequences, heads, longest, head_dim]`` batch under the unmasked causal kernel
(``sequences * longest^2`` scores; the usual case, sequences of similar length), or the run as one row
with its own block-diagonal mask (``run^2``; a few long sequences among short ones). Scores computed are
at most ``T * GROUP_TOKENS`` instead of ``T^2``. Without those kwargs (padded batches, generation) it is
``sdpa``, except on CPU: a masked call with fewer key/value heads than query heads lets the kernel
share the heads (`masked_gqa_attention`), and a bf16/fp16 decoding step without a mask (rows of one
prompt length) goes to `grouped_masked_attention`.

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

from hybridflow.parallel.grouped_attention import grouped_masked_attention, prefers_explicit_attention
from hybridflow.parallel.shared_prefix import SharedPrefixLayout, shared_prefix_attention

VARLEN_SDPA = "hybridflow_varlen_sdpa"

# Tokens per attention call for runs of short sequences. On 2 CPU cores (docs/parallel.md) runs of 256
# to 1024 tokens beat both one call per sequence (2-5x slower on rows of 32-64-token sequences) and one
# call over the whole row (2x slower on a 5.9k-token row).
GROUP_TOKENS = 512


def sequence_runs(cu_seqlens: list[int], group_tokens: int) -> list[list[int]]:
    """Split packed-row offsets ``[num_seqs + 1]`` into runs of consecutive sequences.

    Each run is a list of offsets (its first start, then every end) spanning at most ``group_tokens``
    tokens, except that a longer sequence forms a run of its own.
    """
    runs, first = [], 0
    for end in range(2, len(cu_seqlens)):
        if cu_seqlens[end] - cu_seqlens[first] > group_tokens:
            runs.append(cu_seqlens[first:end])
            first = end - 1
    runs.append(cu_seqlens[first:])
    return runs


def _block_causal_mask(offsets: list[int], device: torch.device) -> torch.Tensor:
    """``[run_len, run_len]`` bool, True where a token may attend: same sequence, not in the future."""
    lengths = torch.tensor([end - start for start, end in itertools.pairwise(offsets)], device=device)
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    return (sequence.unsqueeze(1) == sequence.unsqueeze(0)).tril()


def _padded_run_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    offsets: list[int],
    dropout: float,
    scaling: float | None,
    gqa: bool,
) -> torch.Tensor:
    """Causal attention of the packed sequences between ``offsets`` (absolute, into the row), each
    alone: ``[1, heads, run_len, head_dim]``.

    Sequence ``i`` fills row ``i`` of a ``[sequences, heads, longest, head_dim]`` batch; its padding
    repeats its last token, which no valid query sees under the causal mask, and the padded positions'
    outputs are dropped (so they get no gradient).
    """
    starts = torch.tensor(offsets[:-1], device=query.device)
    lengths = torch.tensor(offsets[1:], device=query.device) - starts
    positions = torch.arange(int(lengths.max()), device=query.device)
    index = starts[:, None] + torch.minimum(positions[None, :], lengths[:, None] - 1)

    def batched(states: torch.Tensor) -> torch.Tensor:  # [1, h, T, d] -> [sequences, h, longest, d]
        return states[0][:, index].transpose(0, 1)

    out = F.scaled_dot_product_attention(
        batched(query), batched(key), batched(value), dropout_p=dropout, scale=scaling, is_causal=True,
        enable_gqa=gqa,
    )  # fmt: skip
    valid = positions[None, :] < lengths[:, None]
    # Row-major over (sequence, position): the valid outputs come back in packed order.
    return out.transpose(0, 1)[:, valid].unsqueeze(0)


def _padding_is_cheaper(offsets: list[int]) -> bool:
    """Whether a padded batch of the run's sequences computes fewer attention scores than the run as one
    masked row."""
    lengths = [end - start for start, end in itertools.pairwise(offsets)]
    return len(lengths) * max(lengths) ** 2 < (offsets[-1] - offsets[0]) ** 2


def masked_gqa_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
) -> torch.Tensor:
    """SDPA of ``query [batch, heads, q_len, head_dim]`` against fewer ``key/value [batch, kv_heads,
    kv_len, head_dim]`` heads under ``attention_mask [batch, 1, q_len, kv_len]`` (``None``: every query
    sees every key); returns ``[batch, q_len, heads, head_dim]``.

    transformers' ``sdpa`` copies every key/value head ``heads / kv_heads`` times whenever a mask is
    given, because CUDA's fused kernels take grouped heads only without a mask. The CPU kernel takes
    both, which spares that copy of the whole KV cache at every decoding step of left-padded prompts
    (a 25M model decoding 128 rows for 128 tokens: 14-16 s -> 10-11 s, docs/rollout.md). In bf16 or
    fp16 the call goes to `grouped_masked_attention` instead, which shares the heads too and is faster
    than the CPU kernel at these precisions (`prefers_explicit_attention`).
    """
    if prefers_explicit_attention(query, dropout):
        out = grouped_masked_attention(query, key, value, attention_mask, scaling)
    else:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
    return out.transpose(1, 2).contiguous()


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
    shared_prefix: SharedPrefixLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query [1, heads, T, head_dim]`` against ``key/value [1, kv_heads, T, head_dim]``.

    Returns ``[1, T, heads, head_dim]`` as transformers' attention functions do. With ``cu_seq_lens_q``
    (``[num_seqs + 1]`` offsets into the packed row) ``attention_mask`` is ignored: the sequences are
    the mask; with ``shared_prefix`` (`hybridflow.parallel.shared_prefix`) the layout is.
    """
    if shared_prefix is not None:
        if sliding_window is not None:
            raise NotImplementedError(f"{VARLEN_SDPA} does not implement sliding-window attention")
        return shared_prefix_attention(query, key, value, shared_prefix, dropout, scaling), None
    if cu_seq_lens_q is None:
        grouped = key.shape[1] != query.shape[1]
        if grouped and attention_mask is not None and query.device.type == "cpu":
            return masked_gqa_attention(query, key, value, attention_mask, dropout, scaling), None
        if attention_mask is None and query.shape[2] == 1 and prefers_explicit_attention(query, dropout):
            # A decoding step of unpadded rows: the CPU flash kernel takes 3-9x longer on one query.
            return masked_gqa_attention(query, key, value, None, dropout, scaling), None
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if sliding_window is not None:
        raise NotImplementedError(f"{VARLEN_SDPA} does not implement sliding-window attention")
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one row, got batch {query.shape[0]}")
    gqa = key.shape[1] != query.shape[1]
    pieces = []
    for run in sequence_runs(cu_seq_lens_q.tolist(), GROUP_TOKENS):
        start, end = run[0], run[-1]
        if end == start:
            continue
        single = len(run) == 2
        if not single and _padding_is_cheaper(run):
            pieces.append(_padded_run_attention(query, key, value, run, dropout, scaling, gqa))
            continue
        pieces.append(
            F.scaled_dot_product_attention(
                query[:, :, start:end],
                key[:, :, start:end],
                value[:, :, start:end],
                attn_mask=None if single else _block_causal_mask([o - start for o in run], query.device),
                dropout_p=dropout,
                scale=scaling,
                is_causal=single,
                enable_gqa=gqa,
            )
        )
    return torch.cat(pieces, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
# Padded calls need the same masks as sdpa.
AttentionMaskInterface.register(VARLEN_SDPA, sdpa_mask)
