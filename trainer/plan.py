"""``hybridflow plan``: each rank's peak memory in every phase of a step, estimated before anything launches.

::

    hybridflow plan --config trainer/config/grpo.yaml actor.ppo_micro_batch_size=32 --device-memory 80GiB
    python -m trainer.plan --config trainer/config/ppo.yaml

The config is loaded and validated as for a run; the model's shapes come from ``model.path``'s
``config.json`` (or the ``model.tiny`` settings), the reward model's from its directory. No process,
model or engine is started. The phases are those of `trainer.algorithms.rl_step`, named as the
trainer's timer names them; each is evaluated at its peak moment. docs/planning.md describes every
component and the measurements that check them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hybridflow.parallel.varlen_attention import GROUP_TOKENS
from hybridflow.planning import (
    AttentionKind,
    MemoryPlan,
    ModelShape,
    PhaseMemory,
    ProcessPlan,
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
    lora_shapes,
    packed_run_tokens,
    parameter_shapes,
    parse_bytes,
    peak_moment,
    render_plan,
    saved_activation_bytes,
)
from hybridflow.planning.model_shape import HeadKind
from trainer.config import (
    ConfigError,
    DerivedSizes,
    OptimizedRoleConfig,
    RunConfig,
    derive_sizes,
    derive_values,
    load_config,
)

__all__ = ["VLLM_CPU_RUNTIME_BYTES", "main", "plan_memory", "policy_shape"]

VLLM_CPU_RUNTIME_BYTES = 28 << 20
"""Live memory a vLLM engine of the CPU build holds besides its weights and KV cache (scheduler,
sampler, model-runner buffers), measured after its first generation with vllm-cpu 0.32 on a 2-layer
model whose weights are negligible (``benchmarks/bench_memory_plan.py --runtime``). Not modelled on GPU."""

_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_VLLM_CPU_BATCHED_TOKENS = 4096
"""vLLM's default ``max_num_batched_tokens`` for the offline ``LLM`` class on CPU, per tp rank."""


@dataclass(frozen=True)
class _Model:
    """One FSDP2-sharded model: its parameter shapes split into the root unit and one decoder layer.
    ``trainable`` names the parameters that train when not all do (a LoRA actor's adapters)."""

    shape: ModelShape
    params: dict[str, tuple[int, ...]]
    world: int
    trainable: dict[str, tuple[int, ...]] | None = None

    @property
    def trained(self) -> dict[str, tuple[int, ...]]:
        """The parameters with gradients and optimizer state."""
        return self.params if self.trainable is None else self.trainable

    def trained_shard(self, itemsize: int) -> int:
        return fsdp_shard_bytes(self.trained.values(), self.world, itemsize)

    @property
    def trained_layer(self) -> list[tuple[int, ...]]:
        return [dims for name, dims in self.trained.items() if name.startswith("model.layers.0.")]

    @property
    def root(self) -> list[tuple[int, ...]]:
        return [dims for name, dims in self.params.items() if not name.startswith("model.layers.")]

    @property
    def layer(self) -> list[tuple[int, ...]]:
        return [dims for name, dims in self.params.items() if name.startswith("model.layers.0.")]

    def head_name(self, head: HeadKind) -> str:
        """The parameter whose gradient the head's backward builds (a tied LM head's is the embedding)."""
        if head == "value":
            return "head.weight"
        if head == "score":
            return "score.weight"
        return "model.embed_tokens.weight" if self.shape.tie_word_embeddings else "lm_head.weight"

    def shard(self, itemsize: int) -> int:
        return fsdp_shard_bytes(self.params.values(), self.world, itemsize)

    def gathered(self, itemsize: int, layers: int) -> int:
        """The root unit and ``layers`` decoder layers all-gathered, in the compute dtype."""
        root = fsdp_unsharded_bytes(self.root, self.world, itemsize)
        return root + layers * fsdp_unsharded_bytes(self.layer, self.world, itemsize)


def _read_hf_config(directory: str, key: str) -> dict:
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise ConfigError([f"{key}: {str(path)!r} not found (the planner reads the model's shapes from it)"])
    return json.loads(path.read_text())


def _shape_from_dir(directory: str, key: str) -> ModelShape:
    try:
        return ModelShape.from_hf_config(
            _read_hf_config(directory, key), source=f"{key} {directory}/config.json"
        )
    except ValueError as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError([f"{key}: {error}"]) from error


def _tiny_vocab_size(config: RunConfig) -> int:
    if config.model.tiny.vocab_size is not None:
        return config.model.tiny.vocab_size
    # Deferred: the tokenizer is only needed when the tiny model's vocabulary follows it.
    from transformers import AutoTokenizer

    from hybridflow.data.char_tokenizer import build_char_tokenizer

    tokenizer = (
        AutoTokenizer.from_pretrained(config.model.tokenizer)
        if config.model.tokenizer
        else build_char_tokenizer()
    )
    return len(tokenizer)


def policy_shape(config: RunConfig) -> ModelShape:
    """The policy's shape: ``model.path``'s ``config.json``, else the tiny Qwen2 of ``model.tiny``
    (built untied, head size ``hidden_size / num_heads``, as `hybridflow.models.build_tiny_causal_lm`).

    Raises:
        ConfigError: naming ``model.path`` when its ``config.json`` is missing or describes a model
            the planner does not know.
    """
    if config.model.path is not None:
        return _shape_from_dir(config.model.path, "model.path")
    tiny = config.model.tiny
    return ModelShape(
        model_type="qwen2",
        vocab_size=_tiny_vocab_size(config),
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        head_dim=tiny.hidden_size // tiny.num_heads,
        intermediate_size=tiny.intermediate_size,
        tie_word_embeddings=False,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        qk_norm=False,
    )


def _compute_dtype(param_dtype: str | None, on_gpu: bool) -> str:
    # A null param_dtype is the device's default compute dtype (hybridflow.parallel.DevicePlan).
    if param_dtype is not None:
        return param_dtype
    return "bfloat16" if on_gpu else "float32"


def _attention(compute: str, on_gpu: bool) -> AttentionKind:
    # flash-attn takes half precision only (hybridflow.parallel.choose_attn_implementation).
    return "flash" if on_gpu and compute != "float32" else "varlen_sdpa"


@dataclass(frozen=True)
class _Batching:
    """How a role splits its rows on one rank: ``micro_rows`` rows per micro-batch, or with ``dynamic``
    up to ``max_tokens`` tokens; ``param_dtype`` is its compute dtype (null: the device default)."""

    micro_rows: int
    dynamic: bool
    max_tokens: int
    param_dtype: str | None

    def tokens(self, rows_per_rank: int, sequence: int) -> int:
        """Packed tokens of the largest micro-batch when every row has ``sequence`` tokens."""
        if self.dynamic:
            return min(self.max_tokens, rows_per_rank * sequence)
        return min(self.micro_rows, rows_per_rank) * sequence


class _Planner:
    """Builds the phases of one step for every kind of worker process of ``config``."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.sizes: DerivedSizes = derive_sizes(config)
        self.on_gpu = config.resource.use_gpu
        self.sequence = config.data.max_prompt_length + config.data.max_response_length
        self.master = _ITEMSIZE[config.model.dtype]
        self.shape = policy_shape(config)
        lora = config.actor.lora
        adapters = lora_shapes(self.shape, lora.target_modules, lora.rank) if lora is not None else {}
        self.actor = _Model(
            self.shape,
            {**parameter_shapes(self.shape, "lm"), **adapters},
            self.sizes.world_size,
            adapters if lora is not None else None,
        )
        # The engines on a rollout pool of their own (`workers.rollout.RolloutWorker`): they never release
        # their memory, and a LoRA actor's push reaches them merged (`workers.weight_push`).
        self.split = config.resource.splits_rollout
        # What the weight push streams, and whether the engine holds adapters of its own.
        pushes_adapters = lora is not None and lora.push == "adapters" and not self.split
        self.engine_adapters = adapters if pushes_adapters else {}
        # The engine's dtype and length; the planner starts no worker, so no model directory is needed.
        self.engine = derive_values(config, self.sizes, total_steps=1, model_dir="").actor.engine
        self.critic = (
            _Model(self.shape, parameter_shapes(self.shape, "value"), self.sizes.critic.world_size)
            if config.critic is not None and self.sizes.critic is not None
            else None
        )
        self.reward_model = None
        if config.reward_model is not None and config.reward_model.path is not None:
            rm_shape = _shape_from_dir(config.reward_model.path, "reward_model.path")
            rm_world = config.resource.world_size_of("reward_model")
            self.reward_model = _Model(rm_shape, parameter_shapes(rm_shape, "score"), rm_world)
        self.teacher = None
        if config.teacher is not None and config.teacher.path is not None:
            teacher_shape = _shape_from_dir(config.teacher.path, "teacher.path")
            teacher_world = config.resource.world_size_of("teacher")
            self.teacher = _Model(teacher_shape, parameter_shapes(teacher_shape, "lm"), teacher_world)

    # ---------------------------------------------------------------- what each process holds

    def roles_by_pool(self) -> dict[str, list[str]]:
        present = ["actor_rollout"]
        if self.critic is not None:
            present.append("critic")
        if self.reward_model is not None:
            present.append("reward_model")
        if self.teacher is not None:
            present.append("teacher")
        if self.split:
            present.append("rollout")
        pools: dict[str, list[str]] = {}
        for role in present:
            pools.setdefault(self.config.resource.pool_of(role), []).append(role)
        return pools

    def resident(self, roles: list[str], phase: str, moment: str) -> dict[str, int]:
        """Bytes that stay allocated across phases, as they stand during ``phase`` at ``moment``."""
        config, out = self.config, {}
        offload = self.on_gpu  # on a CPU-only machine the offload moves are no-ops
        if "actor_rollout" in roles:
            generating = phase == "generation"
            params_away = generating and moment == "sampling" and offload and config.actor.param_offload
            opt_away = generating and offload and config.actor.optimizer_offload
            out["actor params"] = 0 if params_away else self.actor.shard(self.master)
            out["actor optimizer"] = (
                0
                if opt_away
                else adamw_state_bytes(self.actor.trained.values(), self.actor.world, self.master)
            )
            # A LoRA actor's reference is itself with the adapters off: no second copy.
            if config.needs_reference and config.actor.lora is None:
                ref_away = offload and config.ref.param_offload and phase != "ref"
                out["reference params"] = 0 if ref_away else self.actor.shard(self.master)
        if self.holds_engine(roles):
            out.update(self.engine_resident(phase == "generation"))
        if "critic" in roles and self.critic is not None:
            # The critic worker keeps its state on the device in every phase and drops its gradients
            # only when its next update starts.
            out["critic params"] = self.critic.shard(self.master)
            out["critic optimizer"] = adamw_state_bytes(
                self.critic.params.values(), self.critic.world, self.master
            )
            if phase != "critic_update":
                out["critic grads"] = self.critic.shard(self.master)
        if "reward_model" in roles and self.reward_model is not None:
            out["reward model params"] = self.reward_model.shard(self.master)
        if "teacher" in roles and self.teacher is not None and config.teacher is not None:
            teacher_away = offload and config.teacher.param_offload and phase != "teacher"
            out["teacher params"] = 0 if teacher_away else self.teacher.shard(self.master)
        return out

    def holds_engine(self, roles: list[str]) -> bool:
        """Whether the processes of ``roles`` hold the inference engine."""
        return "rollout" in roles if self.split else "actor_rollout" in roles

    def engine_resident(self, generating: bool) -> dict[str, int]:
        """The engine's weights, runtime and cache as they stand in or out of generation."""
        engine, derived, tp = self.config.rollout, self.engine, self.sizes.rollout_tp_size
        itemsize = _ITEMSIZE[derived.dtype]
        if engine.engine == "hf":
            # transformers' generate keeps its cache only while it runs; its model never leaves.
            base = parameter_shapes(self.shape, "lm")
            held = {**base, **self.engine_adapters}
            out = {"engine weights": sum(_numel(d) for d in held.values()) * itemsize}
            if generating:
                out["KV cache"] = self.hf_cache_bytes()
            return out
        # The colocated engine's memory is released between generations unless resharding.free_kv_cache
        # is off: the KV cache on CPU (where vLLM has no sleep mode), the KV cache and the weights on GPU.
        # An engine on a pool of its own keeps everything: nothing else runs in its processes.
        released = self.config.resharding.free_kv_cache and not generating and not self.split
        out = {}
        if not (released and self.on_gpu):
            out["engine weights"] = engine_weight_bytes(
                self.shape, tp, itemsize, host_prepack=not self.on_gpu
            )
        if self.engine_adapters and not (released and self.on_gpu):
            lora = self.config.actor.lora
            assert lora is not None
            out["engine adapter slots"] = engine_lora_slot_bytes(self.shape, lora.rank, tp, itemsize)
        if not self.on_gpu:
            out["engine runtime"] = VLLM_CPU_RUNTIME_BYTES
        if not released:
            out["KV cache"] = engine.kv_cache_bytes
        return out

    def hf_cache_bytes(self) -> int:
        engine, data = self.config.rollout, self.config.data
        rows = self.sizes.prompts_per_rollout_dp_rank * engine.n
        return hf_generate_cache_bytes(
            self.shape,
            min(engine.hf_max_batch_rows, rows),
            data.max_prompt_length,
            data.max_response_length,
            _ITEMSIZE[self.engine.dtype],
        )

    # ---------------------------------------------------------------- phases

    def generation(self, roles: list[str]) -> list[PhaseMemory]:
        """The weight push and the sampling, in the processes of ``roles``: the push's gather buffer in
        the actor's (with a split rollout, also the bucket its rank 0 broadcasts), the received bucket and
        the engine's reload copies where the engine is, and sampling only there."""
        engine, sizes, data = self.config.rollout, self.sizes, self.config.data
        itemsize = _ITEMSIZE[self.engine.dtype]
        rows = sizes.prompts_per_rollout_dp_rank * self.config.rollout.n
        bucket = self.config.resharding.bucket_bytes
        # Streamed tensors are gathered whole (FSDP2 pads dim 0 to the world) in the engine's dtype.
        pushed = self.engine_adapters or self.actor.params
        shape, tp = self.shape, sizes.rollout_tp_size
        push = self.resident(roles, "generation", "weight push")
        if "actor_rollout" in roles:
            streamed = [fsdp_unsharded_bytes([dims], self.actor.world, itemsize) for dims in pushed.values()]
            push["gather buffer"] = gather_buffer_bytes(streamed, bucket)
            if not self.on_gpu:
                push["gloo gather copy"] = gloo_gather_copy_bytes(streamed)
            if self.split:
                push["send bucket"] = bucket
        if not self.holds_engine(roles):
            return [PhaseMemory("generation", "weight push", push)]
        if self.split:
            # One bucket at a time arrives; a tensor larger than a bucket arrives alone, at its size.
            push["receive bucket"] = max([bucket, *(_numel(dims) * itemsize for dims in pushed.values())])
        push["engine reload copies"] = (
            engine_reload_bytes(shape, tp, itemsize, host_prepack=not self.on_gpu)
            if engine.engine == "vllm"
            else 0
        )
        sampling = self.resident(roles, "generation", "sampling")
        if engine.engine == "vllm":
            batched = engine.max_num_batched_tokens or max(
                _VLLM_CPU_BATCHED_TOKENS * tp, self.engine.max_model_len
            )
            step_tokens = min(batched, rows * data.max_prompt_length)
            sampling["engine activations"] = engine_activation_bytes(
                shape, step_tokens, min(engine.max_num_seqs, rows), tp, itemsize
            )
        return [
            PhaseMemory("generation", "weight push", push),
            PhaseMemory("generation", "sampling", sampling),
        ]

    def scored_tokens(self, tokens: int, attention: AttentionKind, use_packing: bool) -> int:
        """Tokens the log-prob head scores in a micro-batch of ``tokens`` packed full-length tokens.

        Packed under the varlen SDPA attention (the CPU path), `workers.actor.sequence_log_probs` runs
        `shared_prefix_log_probs`, which hands the head the positions that predict a response token
        alone: ``response_length`` per row. Otherwise every packed token goes through the head."""
        if not (use_packing and attention == "varlen_sdpa"):
            return tokens
        rows = max(1, tokens // self.sequence)
        return min(tokens, rows * self.config.data.max_response_length)

    def forward(
        self, roles: list[str], phase: str, model: _Model, batching: _Batching, head: HeadKind
    ) -> PhaseMemory:
        """A no-grad forward over micro-batches (log-probs, reference, teacher, values, reward-model
        scores)."""
        compute_name = _compute_dtype(batching.param_dtype, self.on_gpu)
        compute = _ITEMSIZE[compute_name]
        rows_per_rank = -(-self.sizes.rows_per_step // model.world)
        tokens = batching.tokens(rows_per_rank, self.sequence)
        out = self.resident(roles, phase, "forward")
        out["gathered params"] = model.gathered(compute, 2 if self.on_gpu else 1)
        out["activations"] = forward_temporary_bytes(model.shape, tokens, compute)
        if head == "lm":
            chunk, packing = self.config.actor.logit_chunk_size, self.config.actor.use_packing
            if phase == "teacher" and self.config.teacher is not None:
                # The teacher's forwards chunk and pack by its own keys.
                chunk, packing = self.config.teacher.logit_chunk_size, self.config.teacher.use_packing
            scored = self.scored_tokens(tokens, _attention(compute_name, self.on_gpu), packing)
            out["logits"] = logit_head_bytes(
                model.shape.vocab_size, scored, chunk, with_grad=False, with_entropy=False
            )
        return PhaseMemory(phase, f"forward, {tokens} tokens", out)

    def update(
        self,
        roles: list[str],
        phase: str,
        model: _Model,
        role: OptimizedRoleConfig,
        head: HeadKind,
        with_entropy: bool,
    ) -> list[PhaseMemory]:
        """Candidate peaks of an update: the backward of the logit head (the actor's first), the
        backward of a decoder layer, and the optimizer step."""
        update_sizes = self.sizes.actor if phase == "update" else self.sizes.critic
        assert update_sizes is not None
        compute_name = _compute_dtype(role.param_dtype, self.on_gpu)
        compute = _ITEMSIZE[compute_name]
        attention = _attention(compute_name, self.on_gpu)
        batching = _Batching(
            role.ppo_micro_batch_size,
            role.dynamic_batching,
            role.max_tokens_per_micro_batch,
            role.param_dtype,
        )
        tokens = batching.tokens(update_sizes.mini_batch_per_rank, self.sequence)
        run = packed_run_tokens(self.sequence, tokens, GROUP_TOKENS) if attention == "varlen_sdpa" else 0
        grads_key = "actor grads" if phase == "update" else "critic grads"
        grads = model.trained_shard(self.master)
        resident = self.resident(roles, phase, "backward")
        # Gradients of earlier micro-batches are there while a later one runs backward; the count is
        # unknown under dynamic batching, so assume several.
        accumulated = grads if (update_sizes.grad_accum_steps or 2) > 1 else 0
        saved = saved_activation_bytes(
            model.shape, tokens, compute, attention, run, role.activation_checkpointing
        ) + tokens * lora_saved_bytes_per_token(model.trainable or {}, compute)
        head_name = model.head_name(head)
        head_grad = (
            fsdp_unsharded_bytes([model.params[head_name]], model.world, compute) if head_name in model.trained else 0
        )
        common = {**resident, grads_key: accumulated, "gathered params": model.gathered(compute, 2)}
        moments = []
        if head == "lm":
            chunk = self.config.actor.logit_chunk_size
            scored = self.scored_tokens(tokens, attention, self.config.actor.use_packing)
            logits = logit_head_bytes(
                model.shape.vocab_size, scored, chunk, with_grad=True, with_entropy=with_entropy
            )
            moments.append(
                PhaseMemory(
                    phase,
                    f"head backward, {tokens} tokens",
                    {**common, "unsharded grads": head_grad, "activations": saved, "logits": logits},
                )
            )
        # One layer's gradients in the compute dtype, and the fp32 copy FSDP2 reduce-scatters.
        layer_grads = fsdp_unsharded_bytes(model.trained_layer, model.world, compute) + fsdp_unsharded_bytes(
            model.trained_layer, model.world, _ITEMSIZE["float32"]
        )
        recomputed = (
            tokens * layer_saved_bytes_per_token(model.shape, compute, attention, run)
            if role.activation_checkpointing
            else 0
        )
        moments.append(
            PhaseMemory(
                phase,
                f"layer backward, {tokens} tokens",
                {
                    **common,
                    "unsharded grads": head_grad + layer_grads,
                    "activations": saved
                    + recomputed
                    + backward_temporary_bytes(model.shape, tokens, compute),
                },
            )
        )
        # torch's AdamW runs tensor by tensor on CPU (one tensor's temporaries), over all tensors at once
        # (foreach) on GPU.
        largest = max(model.trained.values(), key=_numel)
        temporaries = (
            model.trained_shard(self.master)
            if self.on_gpu
            else fsdp_shard_bytes([largest], model.world, self.master)
        )
        moments.append(
            PhaseMemory(
                phase, "optimizer step", {**resident, grads_key: grads, "optimizer temporaries": temporaries}
            )
        )
        return moments

    def phases(self, roles: list[str]) -> tuple[PhaseMemory, ...]:
        config, actor, ref = self.config, self.config.actor, self.config.ref
        actor_forward = _Batching(
            actor.forward_micro_batch_size,
            actor.dynamic_batching,
            actor.max_tokens_per_micro_batch,
            actor.param_dtype,
        )
        # The reference policy computes in the actor's precision with the ref section's batching.
        ref_forward = _Batching(
            ref.forward_micro_batch_size,
            ref.dynamic_batching,
            ref.max_tokens_per_micro_batch,
            actor.param_dtype,
        )
        phases = [peak_moment(self.generation(roles))]
        if self.reward_model is not None and config.reward_model is not None:
            rm, rm_model = config.reward_model, self.reward_model
            rm_batching = _Batching(
                rm.forward_micro_batch_size,
                rm.dynamic_batching,
                rm.max_tokens_per_micro_batch,
                rm.param_dtype,
            )
            phases.append(
                self._in(
                    roles,
                    "reward_model",
                    "reward",
                    lambda: self.forward(roles, "reward", rm_model, rm_batching, "score"),
                )
            )
        # The rule of trainer.algorithms.needs_old_log_probs.
        if self.sizes.actor.optimizer_steps_per_step > 1 or config.algorithm.use_kl_in_reward:
            phases.append(
                self._in(
                    roles,
                    "actor_rollout",
                    "log_prob",
                    lambda: self.forward(roles, "log_prob", self.actor, actor_forward, "lm"),
                )
            )
        if config.needs_reference:
            phases.append(
                self._in(
                    roles,
                    "actor_rollout",
                    "ref",
                    lambda: self.forward(roles, "ref", self.actor, ref_forward, "lm"),
                )
            )
        if self.teacher is not None and config.teacher is not None:
            teacher, teacher_model = config.teacher, self.teacher
            teacher_forward = _Batching(
                teacher.forward_micro_batch_size,
                teacher.dynamic_batching,
                teacher.max_tokens_per_micro_batch,
                teacher.param_dtype,
            )
            phases.append(
                self._in(
                    roles,
                    "teacher",
                    "teacher",
                    lambda: self.forward(roles, "teacher", teacher_model, teacher_forward, "lm"),
                )
            )
        if self.critic is not None and config.critic is not None:
            critic, critic_model = config.critic, self.critic
            critic_forward = _Batching(
                critic.forward_micro_batch_size,
                critic.dynamic_batching,
                critic.max_tokens_per_micro_batch,
                critic.param_dtype,
            )
            phases.append(
                self._in(
                    roles,
                    "critic",
                    "values",
                    lambda: self.forward(roles, "values", critic_model, critic_forward, "value"),
                )
            )
            phases.append(
                self._in(
                    roles,
                    "critic",
                    "critic_update",
                    lambda: peak_moment(
                        self.update(roles, "critic_update", critic_model, critic, "value", False)
                    ),
                )
            )
        phases.append(
            self._in(
                roles,
                "actor_rollout",
                "update",
                lambda: peak_moment(
                    self.update(roles, "update", self.actor, actor, "lm", actor.entropy_coef > 0)
                ),
            )
        )
        return tuple(phases)

    def _in(self, roles: list[str], role: str, phase: str, active) -> PhaseMemory:
        """The phase as ``active()`` computes it if ``role`` runs in this process, else what it holds."""
        if role in roles:
            return active()
        return PhaseMemory(phase, "idle", self.resident(roles, phase, "idle"))


def _numel(dims: Sequence[int]) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


def plan_memory(config: RunConfig) -> MemoryPlan:
    """Per-rank memory of every phase of a step of ``config``, for every kind of worker process.

    Raises:
        ConfigError: a size does not divide, or a model directory cannot be read (naming the key).
    """
    planner = _Planner(config)
    processes = tuple(
        ProcessPlan("+".join(roles), config.resource.world_size_of(roles[0]), planner.phases(roles))
        for roles in planner.roles_by_pool().values()
    )
    notes = [
        f"tokens per row: data.max_prompt_length + data.max_response_length = {planner.sequence} (every "
        "response at full length)",
        "steady state: optimizer state exists (after the first update)",
        "not included: the process baseline (Python, torch, libraries, process groups; about 0.5 GiB "
        "per process on CPU) and, on GPU, the CUDA context and communication buffers",
    ]
    if planner.on_gpu:
        notes.append("vLLM's own buffers besides weights and KV cache are not modelled on GPU")
    return MemoryPlan("cuda" if planner.on_gpu else "cpu", processes, tuple(notes))


def main(argv: Sequence[str] | None = None) -> int:
    """``hybridflow plan``: print the plan; exit 0, 1 when ``--device-memory`` is given and a process
    does not fit, 2 on a config error (the message names the key)."""
    parser = argparse.ArgumentParser(
        prog="hybridflow plan",
        description="Estimate each rank's peak memory per phase before launching a run.",
    )
    parser.add_argument(
        "--config", help="a YAML file (e.g. trainer/config/grpo.yaml); defaults apply without it"
    )
    parser.add_argument("--device-memory", help="memory of one device (or one process on CPU), e.g. 80GiB")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after the file")
    args = parser.parse_args(argv)
    device_bytes = None
    if args.device_memory is not None:
        try:
            device_bytes = parse_bytes(args.device_memory)
        except ValueError as error:
            parser.error(f"--device-memory: {error}")
    try:
        plan = plan_memory(load_config(args.config, args.overrides))
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    print(render_plan(plan, device_bytes), end="")
    if device_bytes is not None and any(p.peak().total > device_bytes for p in plan.processes):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
