"""Memory terms against hand arithmetic and against what real FSDP2 ranks and autograd allocate."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from hybridflow.models import build_tiny_causal_lm
from hybridflow.parallel import VARLEN_SDPA, build_meshes, packed_log_probs, shard_model
from hybridflow.parallel.launch import run_ranks
from hybridflow.parallel.varlen_attention import GROUP_TOKENS
from hybridflow.planning import (
    ModelShape,
    adamw_state_bytes,
    engine_weight_bytes,
    fsdp_shard_bytes,
    fsdp_unsharded_bytes,
    gather_buffer_bytes,
    logit_head_bytes,
    packed_run_tokens,
    parameter_shapes,
    saved_activation_bytes,
)

# vocab 37 and 3 KV heads make several dim-0 sizes odd, so the 2-rank shards are padded.
SHAPE = ModelShape(
    model_type="qwen2",
    vocab_size=37,
    hidden_size=48,
    num_layers=2,
    num_heads=6,
    num_kv_heads=3,
    head_dim=8,
    intermediate_size=80,
    tie_word_embeddings=False,
    qkv_bias=True,
    o_bias=False,
    mlp_bias=False,
    qk_norm=False,
)


def test_shards_and_adamw_state_by_hand_for_two_ranks() -> None:
    shapes = [(7, 4), (4,), (5, 3)]
    # Rank 0 holds ceil(rows / 2) rows of each: 4 x 4 + 2 + 3 x 3 = 27 fp32 values.
    assert fsdp_shard_bytes(shapes, 2, 4) == 27 * 4
    assert adamw_state_bytes(shapes, 2, 4) == 2 * 27 * 4  # exp_avg and exp_avg_sq
    # Gathered, each tensor is padded to an even row count: 8 x 4 + 4 + 6 x 3 = 54 bf16 values.
    assert fsdp_unsharded_bytes(shapes, 2, 2) == 54 * 2


def _fsdp_bytes(rank: int, world: int) -> dict[str, int]:
    model = build_tiny_causal_lm(
        SHAPE.vocab_size, hidden_size=48, num_layers=2, num_heads=6, num_kv_heads=3, intermediate_size=80
    )
    model.set_attn_implementation(VARLEN_SDPA)
    model.requires_grad_(True)
    model = shard_model(model, build_meshes(world, 1, "cpu").train, mp_policy=MixedPrecisionPolicy())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(4, SHAPE.vocab_size, (2, 9), generator=torch.Generator().manual_seed(rank))
    packed_log_probs(model, ids, torch.ones_like(ids)).log_probs.sum().backward()
    optimizer.step()

    def local_bytes(tensors) -> int:
        return sum(t.to_local().numel() * t.element_size() for t in tensors)

    params = list(model.parameters())
    state = [optimizer.state[p][key] for p in params for key in ("exp_avg", "exp_avg_sq")]
    return {
        "params": local_bytes(params),
        "grads": local_bytes(p.grad for p in params),
        "adam": local_bytes(state),
    }


def test_fsdp2_shards_gradients_and_adamw_state_of_rank_zero_match() -> None:
    rank0, rank1 = run_ranks(_fsdp_bytes, 2, timeout_s=240)
    shapes = parameter_shapes(SHAPE).values()
    assert rank0["params"] == rank0["grads"] == fsdp_shard_bytes(shapes, 2, 4)
    assert rank0["adam"] == adamw_state_bytes(shapes, 2, 4)
    # Rank 1 gets the short end of the odd tensors: rank 0 is the peak rank the planner describes.
    assert rank1["params"] < rank0["params"]


def _saved_tensor_bytes(model: torch.nn.Module, ids: torch.Tensor, chunk: int) -> int:
    """Bytes of the distinct storages autograd saves for backward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        packed_log_probs(model, ids, torch.ones_like(ids), chunk_size=chunk)
    return sum(saved.values())


@pytest.mark.parametrize(
    ("dtype", "rows", "seq"),
    [(torch.float32, 8, 64), (torch.bfloat16, 8, 64), (torch.float32, 2, 600), (torch.bfloat16, 3, 100)],
)
def test_saved_activations_equal_what_autograd_keeps(dtype: torch.dtype, rows: int, seq: int) -> None:
    # 8 x 64 tokens: runs of 8 sequences (a padded batch); 2 x 600: one sequence per call; 3 x 100: runs of 3.
    model = build_tiny_causal_lm(
        SHAPE.vocab_size,
        hidden_size=48,
        num_layers=2,
        num_heads=6,
        num_kv_heads=3,
        intermediate_size=80,
        max_position_embeddings=1024,
    ).to(dtype)
    model.set_attn_implementation(VARLEN_SDPA)
    model.train()
    ids = torch.randint(4, SHAPE.vocab_size, (rows, seq), generator=torch.Generator().manual_seed(0))
    tokens = rows * seq
    run = packed_run_tokens(seq, tokens, GROUP_TOKENS)
    expected = saved_activation_bytes(SHAPE, tokens, dtype.itemsize, "varlen_sdpa", run, checkpointing=False)
    assert _saved_tensor_bytes(model, ids, chunk=128) == expected


def test_packed_runs_logit_chunks_and_gather_buffer() -> None:
    assert packed_run_tokens(64, 8 * 64, 512) == 512  # 8 sequences per call
    assert packed_run_tokens(100, 3 * 100, 512) == 300  # the micro-batch has only 3
    assert packed_run_tokens(300, 4 * 300, 512) == 0  # one sequence per call
    # The chunk never exceeds the tokens; bytes per logit: 8 (no grad), 12 (with entropy), 20 (grad).
    assert logit_head_bytes(1000, 300, 1024, with_grad=False, with_entropy=False) == 300 * 1000 * 8
    assert logit_head_bytes(1000, 3000, 1024, with_grad=False, with_entropy=True) == 1024 * 1000 * 12
    assert logit_head_bytes(1000, 3000, 512, with_grad=True, with_entropy=True) == 512 * 1000 * 20
    # The ring buffer, plus an own allocation for the largest tensor that does not fit in it.
    assert gather_buffer_bytes([10, 300, 20, 150], 100) == 100 + 300
    assert gather_buffer_bytes([10, 20], 100) == 100


def test_engine_weights_by_hand_with_two_tp_ranks() -> None:
    # Vocabulary padded to 64 and split: 32 rows x 48 for the embedding and for the head. Per layer:
    # q/k/v (48 + 2 x 24) x 48 and o 48 x 48, gate/up/down 3 x 80 x 48, all halved; biases (96) halved;
    # two norms (48 each) replicated. Then the final norm.
    per_layer = ((96 * 48 + 48 * 48 + 3 * 80 * 48) // 2) + 96 // 2 + 2 * 48
    expected = 2 * 32 * 48 + 2 * per_layer + 48
    assert engine_weight_bytes(SHAPE, 2, 4, host_prepack=False) == expected * 4
    # The CPU build also keeps a packed copy of the embedding and the head.
    assert engine_weight_bytes(SHAPE, 2, 4, host_prepack=True) == (expected + 2 * 32 * 48) * 4
