"""Memory planning: per-rank bytes of every component in every phase of an RL step, before launch.

- `hybridflow.planning.model_shape`: a model's parameter shapes from its ``config.json``, counted exactly.
- `hybridflow.planning.memory_terms`: pure functions giving the bytes of each component (FSDP2 shards,
  AdamW state, saved activations, the chunked logit head, vLLM weights, ...).
- `hybridflow.planning.plan`: the plan itself (phases x components), its peak and its table.

The trainer's ``hybridflow plan`` command (`trainer.plan`) maps a run config onto these; see docs/planning.md.
"""

from hybridflow.planning.memory_terms import (
    AttentionKind,
    adamw_state_bytes,
    backward_temporary_bytes,
    engine_activation_bytes,
    engine_lora_slot_bytes,
    engine_reload_bytes,
    engine_weight_bytes,
    forward_temporary_bytes,
    fsdp_shard_bytes,
    fsdp_unsharded_bytes,
    gather_buffer_bytes,
    gloo_gather_copy_bytes,
    hf_generate_cache_bytes,
    layer_saved_bytes_per_token,
    logit_head_bytes,
    lora_saved_bytes_per_token,
    model_saved_bytes_per_token,
    packed_run_tokens,
    saved_activation_bytes,
)
from hybridflow.planning.model_shape import (
    SUPPORTED_MODEL_TYPES,
    HeadKind,
    ModelShape,
    count_parameters,
    lora_shapes,
    parameter_shapes,
)
from hybridflow.planning.plan import (
    MemoryPlan,
    PhaseMemory,
    ProcessPlan,
    format_bytes,
    parse_bytes,
    peak_moment,
    render_plan,
)

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "AttentionKind",
    "HeadKind",
    "MemoryPlan",
    "ModelShape",
    "PhaseMemory",
    "ProcessPlan",
    "adamw_state_bytes",
    "backward_temporary_bytes",
    "count_parameters",
    "engine_activation_bytes",
    "engine_lora_slot_bytes",
    "engine_reload_bytes",
    "engine_weight_bytes",
    "format_bytes",
    "forward_temporary_bytes",
    "fsdp_shard_bytes",
    "fsdp_unsharded_bytes",
    "gather_buffer_bytes",
    "gloo_gather_copy_bytes",
    "hf_generate_cache_bytes",
    "layer_saved_bytes_per_token",
    "logit_head_bytes",
    "lora_saved_bytes_per_token",
    "lora_shapes",
    "model_saved_bytes_per_token",
    "packed_run_tokens",
    "parameter_shapes",
    "parse_bytes",
    "peak_moment",
    "render_plan",
    "saved_activation_bytes",
]
