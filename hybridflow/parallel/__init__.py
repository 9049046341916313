"""Process groups and device meshes, FSDP2 wrapping, CPU offload, weight streaming, sequence packing."""

from hybridflow.parallel.checkpointing import apply_activation_checkpointing
from hybridflow.parallel.device import (
    FLASH_ATTENTION,
    DevicePlan,
    choose_attn_implementation,
    local_device_plan,
    on_worker_device,
    places_batches_on_device,
    plan_devices,
    process_group_device_plan,
)
from hybridflow.parallel.fsdp import (
    accumulation_steps,
    default_mixed_precision,
    find_decoder_layers,
    reshard_all,
    shard_model,
)
from hybridflow.parallel.launch import run_ranks
from hybridflow.parallel.logprobs import token_log_probs, token_statistics
from hybridflow.parallel.mesh import (
    DpRankInfo,
    ParallelMeshes,
    build_meshes,
    data_parallel_size,
    dp_rank_info,
    mesh_dp_rank_info,
)
from hybridflow.parallel.microbatch import MicroBatchPlan, agree_micro_batch_count, plan_micro_batches
from hybridflow.parallel.model_forward import (
    TokenLogProbs,
    packed_log_probs,
    packing_kwargs,
    padded_log_probs,
    shared_prefix_log_probs,
)
from hybridflow.parallel.offload import (
    TransferStats,
    free_gradients,
    load_fsdp_params,
    load_optimizer_state,
    local_bytes,
    offload_fsdp_params,
    offload_optimizer_state,
)
from hybridflow.parallel.packing import PackedSequences, pack_sequences, position_ids_from_mask, unpack_tokens
from hybridflow.parallel.token_stats import (
    TOKEN_STATISTICS,
    TokenStatistic,
    register_token_statistic,
    resolve_token_statistics,
)
from hybridflow.parallel.varlen_attention import (
    VARLEN_SDPA,
    sequence_runs,
    varlen_sdpa_attention,
)
from hybridflow.parallel.weights import hf_param_name, iter_buckets, iter_full_state

__all__ = [
    "FLASH_ATTENTION",
    "TOKEN_STATISTICS",
    "VARLEN_SDPA",
    "DevicePlan",
    "DpRankInfo",
    "MicroBatchPlan",
    "PackedSequences",
    "ParallelMeshes",
    "TokenLogProbs",
    "TokenStatistic",
    "TransferStats",
    "accumulation_steps",
    "agree_micro_batch_count",
    "apply_activation_checkpointing",
    "build_meshes",
    "choose_attn_implementation",
    "data_parallel_size",
    "default_mixed_precision",
    "dp_rank_info",
    "find_decoder_layers",
    "free_gradients",
    "hf_param_name",
    "iter_buckets",
    "iter_full_state",
    "load_fsdp_params",
    "load_optimizer_state",
    "local_bytes",
    "local_device_plan",
    "mesh_dp_rank_info",
    "offload_fsdp_params",
    "offload_optimizer_state",
    "on_worker_device",
    "pack_sequences",
    "packed_log_probs",
    "packing_kwargs",
    "padded_log_probs",
    "places_batches_on_device",
    "plan_devices",
    "plan_micro_batches",
    "position_ids_from_mask",
    "process_group_device_plan",
    "register_token_statistic",
    "reshard_all",
    "resolve_token_statistics",
    "run_ranks",
    "sequence_runs",
    "shard_model",
    "shared_prefix_log_probs",
    "token_log_probs",
    "token_statistics",
    "unpack_tokens",
    "varlen_sdpa_attention",
]
