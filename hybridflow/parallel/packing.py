"""Sequence packing ("remove padding"): all valid tokens of a padded batch in one row, and back.

Rollout batches are padded to the longest sample, and RL lengths are skewed (a few long answers, many
short ones), so a padded forward spends most of its compute on pad tokens. Packing drops them: the model
sees one row of ``total_tokens`` tokens whose ``position_ids`` restart at 0 for every sequence, and the
attention kernel is told where each sequence starts (see ``hybridflow.parallel.logprobs``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedSequences:
    """A padded batch flattened to its valid tokens.

    Attributes:
        input_ids: ``[1, total_tokens]`` the valid tokens, sequence after sequence.
        position_ids: ``[1, total_tokens]`` position of each token inside its own sequence (0-based).
        indices: ``[total_tokens]`` flat index of each packed token in the padded ``[batch * seq_len]``.
        cu_seqlens: ``[batch + 1]`` int32 offsets of the sequences in the packed row (flash-attn varlen).
        max_seqlen: length of the longest sequence, in tokens.
        batch_size, seq_len: shape of the padded batch.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    indices: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    batch_size: int
    seq_len: int

    @property
    def total_tokens(self) -> int:
        return self.input_ids.shape[1]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[batch, seq_len]`` positions that count only valid tokens, so left padding does not shift them.

    Pad positions get 0; they are never attended to.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def pack_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedSequences:
    """Pack ``input_ids [batch, seq_len]`` with ``attention_mask [batch, seq_len]`` (1 = valid token).

    Works for right, left and mixed (left-padded prompt + right-padded response) padding: the valid
    tokens of a row are taken in order, wherever they are.
    """
    if input_ids.shape != attention_mask.shape:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)}"
        )
    batch_size, seq_len = input_ids.shape
    mask = attention_mask.bool()
    indices = mask.flatten().nonzero().squeeze(1)
    seqlens = mask.sum(-1, dtype=torch.int32)
    cu_seqlens = torch.nn.functional.pad(seqlens.cumsum(0, dtype=torch.int32), (1, 0))
    positions = position_ids_from_mask(mask).flatten()[indices]
    return PackedSequences(
        input_ids=input_ids.flatten()[indices].unsqueeze(0),
        position_ids=positions.unsqueeze(0),
        indices=indices,
        cu_seqlens=cu_seqlens,
        max_seqlen=int(seqlens.max()) if batch_size else 0,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def unpack_tokens(values: torch.Tensor, packed: PackedSequences, fill: float = 0.0) -> torch.Tensor:
    """Scatter per-token ``values [total_tokens]`` back to ``[batch, seq_len]``; pads get ``fill``."""
    out = values.new_full((packed.batch_size * packed.seq_len,), fill)
    out = out.index_put((packed.indices,), values)
    return out.view(packed.batch_size, packed.seq_len)
