"""Process groups and device meshes, FSDP2 wrapping, CPU offload, weight streaming, sequence packing."""

from hybridflow.parallel.checkpointing import apply_activation_checkpointing
from hybridflow.parallel.fsdp import default_mixed_precision, find_decoder_layers, reshard_all, shard_model
from hybridflow.parallel.launch import run_ranks
from hybridflow.parallel.logprobs import token_log_probs
from hybridflow.parallel.mesh import (
    DpRankInfo,
    ParallelMeshes,
    build_meshes,
    data_parallel_size,
    default_device_type,
    dp_rank_info,
    mesh_dp_rank_info,
)
from hybridflow.parallel.microbatch import MicroBatchPlan, agree_micro_batch_count, plan_micro_batches
from hybridflow.parallel.model_forward import (
    TokenLogProbs,
    packed_log_probs,
    packing_kwargs,
    padded_log_probs,
)
from hybridflow.parallel.offload import (
    TransferStats,
    free_gradients,
    load_fsdp_params,
    load_optimizer_state,
    offload_fsdp_params,
    offload_optimizer_state,
)
from hybridflow.parallel.packing import PackedSequences, pack_sequences, position_ids_from_mask, unpack_tokens
from hybridflow.parallel.varlen_attention import (
    VARLEN_SDPA,
    sequence_runs,
    training_attn_implementation,
    varlen_sdpa_attention,
)
from hybridflow.parallel.weights import hf_param_name, iter_buckets, iter_full_state

__all__ = [
    "VARLEN_SDPA",
    "DpRankInfo",
    "MicroBatchPlan",
    "PackedSequences",
    "ParallelMeshes",
    "TokenLogProbs",
    "TransferStats",
    "agree_micro_batch_count",
    "apply_activation_checkpointing",
    "build_meshes",
    "data_parallel_size",
    "default_device_type",
    "default_mixed_precision",
    "dp_rank_info",
    "find_decoder_layers",
    "free_gradients",
    "hf_param_name",
    "iter_buckets",
    "iter_full_state",
    "load_fsdp_params",
    "load_optimizer_state",
    "mesh_dp_rank_info",
    "offload_fsdp_params",
    "offload_optimizer_state",
    "pack_sequences",
    "packed_log_probs",
    "packing_kwargs",
    "padded_log_probs",
    "plan_micro_batches",
    "position_ids_from_mask",
    "reshard_all",
    "run_ranks",
    "sequence_runs",
    "shard_model",
    "token_log_probs",
    "training_attn_implementation",
    "unpack_tokens",
    "varlen_sdpa_attention",
]
