"""Shared-prefix packing: the responses to one prompt share one forward of that prompt.

GRPO-style batches hold ``n`` responses per prompt. Packed as they are, every row repeats its prompt,
so the prompt's tokens go through the model ``n`` times. Here each distinct prompt of a micro-batch is
packed once, followed by the responses that continue it as *branches*: a branch token attends to the
whole prompt and to the earlier tokens of its own branch, and its RoPE position continues from the
prompt's length, so every token sees exactly the context it has in its own row. The gradient of the
prompt's activations is the sum over its branches, which is what the repeated rows would give. Two
more things are left out because nothing reads them: the last token of every response (no later token
of its row attends to it, and it predicts nothing that is scored) and the lm_head on prompt positions
(only the prompt's last position scores a token: each branch's first).

For a prompt of ``p`` tokens and ``n`` responses of ``m`` tokens the forward computes ``p + n (m - 1)``
tokens instead of ``n (p + m)``; on the demo's task (``p`` about 7, ``m`` about 4, ``n = 8``) that is 31
instead of 88.

Attention over this layout runs in `hybridflow.parallel.varlen_attention` (the ``shared_prefix`` keyword
that `shared_prefix_log_probs` passes through the model): each prompt and each branch is one *segment*
of queries with the keys it sees, and segments of like sizes go through one masked SDPA call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.parallel.grouped_attention import grouped_masked_attention, prefers_explicit_attention

__all__ = ["AttentionBucket", "SharedPrefixLayout", "shared_prefix_attention", "shared_prefix_layout"]

# A bucket may pad its segments to at most this multiple of the scores they need (plus a small
# constant, so that many tiny segments still share one call).
_PADDING_SLACK = 1.5
_SMALL_BUCKET_SCORES = 4096
# Scores of one bucket per head, bounding the memory of a masked call that materialises them.
_MAX_BUCKET_SCORES = 1 << 22


@dataclass(frozen=True)
class AttentionBucket:
    """Segments attended in one SDPA call, padded to a common shape.

    Attributes:
        query_index: ``[segments, queries]`` packed-row index of each query (padding repeats a valid one).
        key_index: ``[segments, keys]`` packed-row index of each key the segment's queries may see.
        mask: ``[segments, 1, queries, keys]`` bool, True where the query attends to the key.
        valid: ``[segments, queries]`` bool, False on padding queries (their outputs are dropped).
    """

    query_index: torch.Tensor
    key_index: torch.Tensor
    mask: torch.Tensor
    valid: torch.Tensor


@dataclass(frozen=True)
class SharedPrefixLayout:
    """A micro-batch packed with each distinct prompt once and its responses as branches.

    Attributes:
        input_ids: ``[1, tokens]`` the packed row.
        position_ids: ``[1, tokens]`` each token's position in its own row (branches continue the prompt).
        buckets: the attention calls that cover every packed token once as a query.
        output_index: ``[tokens]`` for each packed token, its row among the buckets' outputs, each
            flattened to ``[segments * queries]`` and concatenated in bucket order.
        predictor: ``[scored]`` packed index of the hidden state that predicts each scored token.
        labels: ``[scored]`` the scored (response) tokens.
        target_rows, target_cols: ``[scored]`` where each scored token sits in ``responses [batch, len]``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    buckets: tuple[AttentionBucket, ...]
    output_index: torch.Tensor
    predictor: torch.Tensor
    labels: torch.Tensor
    target_rows: torch.Tensor
    target_cols: torch.Tensor

    @property
    def total_tokens(self) -> int:
        return self.input_ids.shape[1]


@dataclass
class _Segment:
    queries: list[int]  # packed indices
    keys: list[int]  # packed indices, in position order
    first_query_position: int  # position of queries[0]; keys sit at positions 0, 1, ...


def _bucket_segments(segments: list[_Segment]) -> list[list[_Segment]]:
    """Group segments into calls: sorted by size, a segment joins the current call while the padded
    call computes at most `_PADDING_SLACK` times the scores its segments need."""
    ordered = sorted(segments, key=lambda s: (len(s.keys), len(s.queries)))
    buckets: list[list[_Segment]] = []
    needed = widest_q = 0
    for segment in ordered:
        if buckets:
            current = buckets[-1]
            width_q = max(len(segment.queries), widest_q)
            width_k = len(segment.keys)  # sorted by key count: the largest so far
            padded = (len(current) + 1) * width_q * width_k
            total = needed + len(segment.queries) * len(segment.keys)
            if padded <= _PADDING_SLACK * total + _SMALL_BUCKET_SCORES and padded <= _MAX_BUCKET_SCORES:
                current.append(segment)
                needed, widest_q = total, width_q
                continue
        buckets.append([segment])
        needed, widest_q = len(segment.queries) * len(segment.keys), len(segment.queries)
    return buckets


def _attention_bucket(segments: list[_Segment]) -> AttentionBucket:
    width_q = max(len(s.queries) for s in segments)
    width_k = max(len(s.keys) for s in segments)
    # Built as Python lists and converted once: a few small tensor ops per segment cost more than the
    # whole bucket's lists at micro-batch sizes.
    query_index = torch.tensor([s.queries + s.queries[:1] * (width_q - len(s.queries)) for s in segments])
    key_index = torch.tensor([s.keys + [0] * (width_k - len(s.keys)) for s in segments])
    query_position = torch.tensor(
        [
            [*range(s.first_query_position, s.first_query_position + len(s.queries))]
            + [-1] * (width_q - len(s.queries))
            for s in segments
        ]
    )
    key_count = torch.tensor([[len(s.keys)] for s in segments])
    valid = query_position >= 0
    key_position = torch.arange(width_k)
    mask = (key_position[None, None, :] <= query_position[:, :, None]) & (
        key_position[None, None, :] < key_count[:, :, None]
    )
    # Padding queries see the segment's first key: a row with no visible key would give NaN outputs,
    # and NaN times a zero gradient is still NaN in backward.
    mask[:, :, 0] |= ~valid
    return AttentionBucket(query_index, key_index, mask.unsqueeze(1), valid)


def shared_prefix_layout(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor
) -> SharedPrefixLayout:
    """Pack a micro-batch with every distinct prompt once.

    Args:
        prompt_ids, prompt_mask: ``[batch, prompt_len]`` prompts (the valid tokens of a row, wherever
            they are, form its prompt; each row needs at least one).
        responses, response_mask: ``[batch, response_len]``; a row's valid tokens form its response.

    Rows with the same prompt tokens share one prompt, whether or not they are adjacent.
    """
    empty = (prompt_mask.sum(dim=1) == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"rows {empty} have no prompt token; shared-prefix packing needs one per row")
    # One conversion to lists and Python filtering: per-row tensor indexing costs more at these sizes.
    prompt_rows = [
        [token for token, keep in zip(ids, mask, strict=True) if keep]
        for ids, mask in zip(prompt_ids.tolist(), prompt_mask.tolist(), strict=True)
    ]
    response_cols = [[col for col, keep in enumerate(mask) if keep] for mask in response_mask.tolist()]
    response_rows = [
        [ids[col] for col in cols] for ids, cols in zip(responses.tolist(), response_cols, strict=True)
    ]
    groups: dict[tuple[int, ...], list[int]] = {}
    for row, prompt in enumerate(prompt_rows):
        groups.setdefault(tuple(prompt), []).append(row)

    tokens: list[int] = []
    positions: list[int] = []
    segments: list[_Segment] = []
    predictor: list[int] = []
    labels: list[int] = []
    target_rows: list[int] = []
    target_cols: list[int] = []
    for prompt, rows in groups.items():
        prompt_index = list(range(len(tokens), len(tokens) + len(prompt)))
        tokens += prompt
        positions += range(len(prompt))
        segments.append(_Segment(prompt_index, prompt_index, 0))
        for row in rows:
            response, cols = response_rows[row], response_cols[row]
            if not response:
                continue
            branch = response[:-1]
            branch_index = list(range(len(tokens), len(tokens) + len(branch)))
            tokens += branch
            positions += range(len(prompt), len(prompt) + len(branch))
            if branch:
                segments.append(_Segment(branch_index, prompt_index + branch_index, len(prompt)))
            predictor += [prompt_index[-1], *branch_index]
            labels += response
            target_rows += [row] * len(response)
            target_cols += cols

    buckets = tuple(_attention_bucket(b) for b in _bucket_segments(segments))
    output_index = torch.empty(len(tokens), dtype=torch.long)
    offset = 0
    for bucket in buckets:
        output_index[bucket.query_index[bucket.valid]] = offset + bucket.valid.flatten().nonzero().flatten()
        offset += bucket.valid.numel()
    device = prompt_ids.device

    def as_tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    return SharedPrefixLayout(
        input_ids=as_tensor(tokens).unsqueeze(0),
        position_ids=as_tensor(positions).unsqueeze(0),
        buckets=tuple(
            AttentionBucket(*(t.to(device) for t in (b.query_index, b.key_index, b.mask, b.valid)))
            for b in buckets
        ),
        output_index=output_index.to(device),
        predictor=as_tensor(predictor),
        labels=as_tensor(labels),
        target_rows=as_tensor(target_rows),
        target_cols=as_tensor(target_cols),
    )


def shared_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: SharedPrefixLayout,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of the packed row under ``layout``: ``query [1, heads, tokens, head_dim]`` against
    ``key/value [1, kv_heads, tokens, head_dim]``; returns ``[1, tokens, heads, head_dim]``.

    The gathers work on token-major rows (``[tokens, heads * head_dim]``) with ``index_select``, whose
    backward adds whole rows; indexing the head-major states instead adds one ``head_dim`` vector at a
    time in an ``index_put`` (the 3.1M model of ``benchmarks/bench_grouped_attention.py``, bf16 forward
    + backward over 256 rows: 418 ms -> 391 ms, the two interleaved in one process).
    """
    tokens, heads, head_dim = query.shape[2], query.shape[1], query.shape[3]
    gqa = key.shape[1] != heads

    def token_major(states: torch.Tensor) -> torch.Tensor:  # [1, h, tokens, d] -> [tokens, h * d]
        return states[0].transpose(0, 1).reshape(tokens, -1)

    def gathered(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:  # [segments, h, width, d]
        segments, width = index.shape
        return rows.index_select(0, index.flatten()).view(segments, width, -1, head_dim).transpose(1, 2)

    query_rows, key_rows, value_rows = token_major(query), token_major(key), token_major(value)
    explicit = prefers_explicit_attention(query, dropout)
    pieces = []
    for bucket in layout.buckets:
        q = gathered(query_rows, bucket.query_index)
        k, v = gathered(key_rows, bucket.key_index), gathered(value_rows, bucket.key_index)
        if explicit:
            out = grouped_masked_attention(q, k, v, bucket.mask, scaling)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bucket.mask, dropout_p=dropout, scale=scaling, enable_gqa=gqa
            )
        pieces.append(out.transpose(1, 2).reshape(-1, heads * head_dim))  # [segments * width, h * d]
    return torch.cat(pieces).index_select(0, layout.output_index).view(1, tokens, heads, head_dim)
