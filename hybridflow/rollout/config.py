"""The ``rollout`` section of a run config, which is the rollout engine's own settings, and what an
engine takes from outside it (`EngineDerived`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hybridflow.config_fields import Dtype, check_bounds, config_field

__all__ = ["ENGINE_NAMES", "EngineDerived", "RolloutConfig", "ValSamplingConfig"]

ENGINE_NAMES = ("vllm", "hf")


@dataclass(frozen=True)
class ValSamplingConfig:
    """Sampling for validation; the default is one greedy sample per prompt. ``top_k`` -1 disables top-k."""

    n: int = config_field(1, ge=1)
    temperature: float = config_field(0.0, ge=0)
    top_p: float = config_field(1.0, gt=0, le=1)
    top_k: int = config_field(-1, ge=-1)


@dataclass(frozen=True)
class RolloutConfig:
    """The generation engine and how it samples during training (docs/config.md, ``rollout``).

    Attributes:
        engine: ``"vllm"`` or ``"hf"`` (transformers ``generate``; the reference and fallback).
        dtype: the engine's weights and compute dtype; ``None`` is ``model.dtype`` (`EngineDerived`).
        n: samples per prompt; at least 2 for the group-relative estimators, hence the default of 8.
        temperature, top_p, top_k: training sampling (the trainer's steps read them); ``top_k`` -1 is off.
        tp_size: vLLM TP size; groups of this many consecutive ranks form one engine. The world size
            must divide by it; the ``world / tp_size`` engines are the data-parallel ranks.
        kv_cache_bytes: vLLM KV cache per rank, in bytes. Always bounded: unbounded, the CPU build
            takes most of the host memory.
        max_num_seqs: most sequences vLLM decodes in one step.
        max_num_batched_tokens: most tokens vLLM processes in one step; ``None`` lets vLLM choose. On
            CPU prompts are never split across steps (see ``VLLMRolloutEngine``), so it must be at
            least the engine's ``max_model_len`` there.
        enforce_eager: skip vLLM's torch.compile (faster start, slower steps).
        cache_dir: directory for vLLM's and TorchInductor's compile caches (``VLLM_CACHE_ROOT``,
            ``TORCHINDUCTOR_CACHE_DIR``); sharing it between runs cuts engine start from ~25 s to ~5 s.
            ``None`` leaves the environment as it is.
        seed: base seed; data-parallel group ``d`` uses ``seed + d`` so dp groups sample differently.
        hf_max_batch_rows: the HF engine decodes at most this many sample rows at once (at least one
            prompt's ``n``); bounds its KV cache and the ``[rows, vocab]`` logits of a step.
        enable_prefix_caching: vLLM reuses the KV cache of prompt blocks it computed before (the samples
            of one prompt, the continuations of one prefix); only whole blocks are shared (128 tokens on
            CPU).
        enable_prompt_embeds: let the vLLM engine take input embeddings instead of token ids
            (``embedding_session``; the HF engine always can). A worker class that decodes from
            embeddings turns it on.
        val_sampling: validation sampling.
    """

    engine: Literal["vllm", "hf"] = "vllm"
    dtype: Dtype | None = None
    n: int = config_field(8, ge=1)
    temperature: float = config_field(1.0, ge=0)
    top_p: float = config_field(1.0, gt=0, le=1)
    top_k: int = config_field(-1, ge=-1)
    tp_size: int = config_field(1, ge=1)
    kv_cache_bytes: int = config_field(256 << 20, ge=1)
    max_num_seqs: int = config_field(256, ge=1)
    max_num_batched_tokens: int | None = config_field(None, ge=1)
    enforce_eager: bool = False
    cache_dir: str | None = None
    seed: int = config_field(0, ge=0, le=2**31 - 1)
    hf_max_batch_rows: int = config_field(256, ge=1)
    enable_prefix_caching: bool = True
    enable_prompt_embeds: bool = False
    val_sampling: ValSamplingConfig = field(default_factory=ValSamplingConfig)

    def __post_init__(self) -> None:
        check_bounds(self, "rollout")


@dataclass(frozen=True)
class EngineDerived:
    """What an engine takes from outside the ``rollout`` section; a run computes it once
    (``trainer.config.derive_values``) and never writes it back.

    Attributes:
        dtype: the engine's weights and compute dtype: ``rollout.dtype``, or ``model.dtype`` when null.
        max_model_len: most tokens of prompt + response, ``data.max_prompt_length +
            data.max_response_length`` (vLLM sizes its buffers by it).
    """

    dtype: Dtype = "float32"
    max_model_len: int = 1024
