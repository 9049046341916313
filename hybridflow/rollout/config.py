"""`RolloutConfig`: the typed, validated settings of a rollout engine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENGINE_NAMES", "RolloutConfig"]

ENGINE_NAMES = ("vllm", "hf")
_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class RolloutConfig:
    """Settings of a rollout engine.

    Attributes:
        name: ``"vllm"`` or ``"hf"`` (transformers ``generate``; the reference and fallback).
        tensor_parallel_size: vLLM TP size; groups of this many consecutive ranks form one engine.
            The world size must divide by it; the ``world / tp`` engines are the data-parallel ranks.
        dtype: weights and compute dtype of the engine.
        seed: base seed; data-parallel rank ``d`` uses ``seed + d`` so dp ranks sample differently.
        max_model_len: most tokens of prompt + response (vLLM sizes its buffers by it).
        kv_cache_memory_bytes: vLLM KV cache per rank, in bytes. Always bounded: unbounded, the CPU
            build takes most of the host memory.
        max_num_seqs: most sequences vLLM decodes in one step.
        max_num_batched_tokens: most tokens vLLM processes in one step; ``None`` lets vLLM choose. On
            CPU prompts are never split across steps (see ``VLLMRolloutEngine``), so it must be at
            least ``max_model_len`` there.
        enforce_eager: skip vLLM's torch.compile (faster start, slower steps).
        cache_dir: directory for vLLM's and TorchInductor's compile caches (``VLLM_CACHE_ROOT``,
            ``TORCHINDUCTOR_CACHE_DIR``); sharing it between runs cuts engine start from ~25 s to ~5 s.
            ``None`` leaves the environment as it is.
        hf_max_batch_rows: the HF engine decodes at most this many sample rows at once (at least one
            prompt's ``n``); bounds its KV cache and the ``[rows, vocab]`` logits of a step.
        enable_prompt_embeds: let the vLLM engine take input embeddings instead of token ids
            (``embedding_session``; the HF engine always can). Off by default: a worker class that
            decodes from embeddings turns it on.
        enable_prefix_caching: vLLM reuses the KV cache of prompt blocks it computed before (the samples
            of one prompt, the continuations of one prefix); only whole blocks are shared (128 tokens on
            CPU).
    """

    name: str = "vllm"
    tensor_parallel_size: int = 1
    dtype: str = "float32"
    seed: int = 0
    max_model_len: int = 1024
    kv_cache_memory_bytes: int = 256 << 20
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    enforce_eager: bool = False
    cache_dir: str | None = None
    hf_max_batch_rows: int = 256
    enable_prompt_embeds: bool = False
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.name not in ENGINE_NAMES:
            raise ValueError(f"rollout.name must be one of {ENGINE_NAMES}, got {self.name!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"rollout.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        positive = {
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_model_len": self.max_model_len,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "max_num_seqs": self.max_num_seqs,
            "hf_max_batch_rows": self.hf_max_batch_rows,
        }
        for key, value in positive.items():
            if value < 1:
                raise ValueError(f"rollout.{key} must be >= 1, got {value}")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError(
                f"rollout.max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}"
            )
        if not 0 <= self.seed < 2**31:
            raise ValueError(f"rollout.seed must be in [0, 2**31), got {self.seed}")
