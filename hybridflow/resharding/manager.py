"""`ReshardingManager`: the only way a worker's weights change layout.

Each worker process holds the policy twice in two layouts: the FSDP2 **training layout** (every
rank holds a 1/world shard of every parameter, plus gradients and optimizer state) and the
**inference layout** (the rollout engine's weights, tensor-parallel within its tp group, plus its KV
cache). ``with manager:`` switches train -> inference on entry and back on exit::

    with resharder:                     # train -> inference
        rollouts = engine.generate(prompts, sampling)
                                        # inference -> train

**Train -> inference**, in the order that keeps memory lowest:

1. drop gradients; offload optimizer state to host memory if asked;
2. give the engine its memory back (``engine.resume()``: KV cache, weights where freed);
3. stream the parameters: each one is all-gathered from its FSDP shards, under its Hugging Face
   name, straight into a slot of one gather buffer of ``bucket_bytes`` that is reused as a ring
   (`WeightStreamer`), and handed to ``engine.update_weights``. The gathered weights never take
   more than that one buffer on top of the engine's own copy; a slot the engine still holds is
   never overwritten (the buffer is left to the engine and a new one started, counted in the
   report). The engine's reload may add its own transient copies (vLLM's CPU build rebuilds each
   fused layer before copying it in);
4. offload the FSDP parameter shards to host memory if asked (after streaming, because the
   all-gather runs on the training device).

**Inference -> train**: ``engine.release()`` frees the KV cache (on CPU by shrinking its storages,
since vLLM's sleep mode does nothing there), then optimizer state and parameter shards come back.

The GPU path follows the same order: weights are woken before the KV cache is reallocated, so the
largest allocation happens when the training state is already off the device. When the engine
lives in another process, the bucket would be passed as CUDA IPC handles instead of tensors; the
manager's contract (an iterator of named tensors per switch) stays the same.

**LoRA.** For a model with LoRA adapters (``lora``), an engine that holds the same adapters
(``engine.takes_adapters``) gets the adapter tensors alone: only they are gathered, all in one
collective (`WeightStreamer.stream_packed`), a few MB instead of the model. Any other engine gets full
weights with the adapters merged in (`hybridflow.lora.merge_adapters`, each layer's
``W + scaling * B A`` as its three tensors arrive), bucket by bucket as before; the report says which
(``resharding/lora_push_merged``).

Every switch records a `SwitchReport`: seconds, bytes handed to the engine, bytes freed or restored, and peak
memory (RSS on CPU, allocated memory on GPU).

On CPU, for an engine that holds host memory of its own (``engine.trims_host_memory``: vLLM), each
switch hands the heap's freed memory back to the operating system, so that the other layout's
allocations find it; for the HF engine, which decodes with the training process's own tensors, it
does not (a trim would only make the next phase fault its pages in again).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from hybridflow.config_fields import check_bounds, config_field
from hybridflow.lora import LoraConfig, is_adapter_name, merge_adapters
from hybridflow.parallel.offload import (
    free_gradients,
    load_fsdp_params,
    load_optimizer_state,
    offload_fsdp_params,
    offload_optimizer_state,
)
from hybridflow.parallel.weights import tensor_bytes
from hybridflow.resharding.memory import (
    PeakMemoryTracker,
    current_memory_bytes,
    return_freed_host_memory,
    trim_host_memory_above,
)
from hybridflow.resharding.streaming import WeightStreamer
from hybridflow.rollout.base import RolloutEngine

__all__ = ["ReshardingConfig", "ReshardingManager", "SwitchReport"]


@dataclass(frozen=True)
class ReshardingConfig:
    """The ``resharding`` section of a run config: how the layouts switch.

    Whether the training state leaves the device during generation is the actor's choice
    (``actor.param_offload``, ``actor.optimizer_offload``), passed to `ReshardingManager` beside this.

    Attributes:
        bucket_bytes: size of the reused gather buffer: the most bytes of gathered full weights
            held at once while streaming (a single tensor larger than this gets its own buffer).
        free_kv_cache: release the engine's memory (KV cache) in the training layout and restore it
            before generating; ``False`` keeps it allocated throughout (no reallocation per switch, at
            the cost of the training phases' headroom).
        max_log_prob_gap: the trainer fails a step whose rollout-vs-trainer log-prob gap
            (``sync/log_prob_abs_diff_max``) exceeds it, a sign that the weight push went wrong;
            ``None``: no check.
    """

    bucket_bytes: int = config_field(16 * 1024**2, ge=1)
    free_kv_cache: bool = True
    max_log_prob_gap: float | None = config_field(None, gt=0)

    def __post_init__(self) -> None:
        check_bounds(self, "resharding")


@dataclass(frozen=True)
class SwitchReport:
    """One layout switch, as measured on this rank.

    Attributes:
        direction: ``"to_inference"`` or ``"to_training"``.
        seconds: wall time of the switch.
        bytes_streamed: bytes of weights handed to the engine (adapter tensors alone for an
            adapter-only push).
        gather_buffers: gather buffers allocated (1 unless a tensor outgrew the buffer or the
            engine still held a slot when the ring came round to it).
        retired_buffers: buffers left to the engine because it still held one of their slots.
        engine_bytes: bytes the engine restored (to_inference) or freed (to_training).
        offloaded_bytes: training-state bytes moved to host (to_inference) or back (to_training).
        start_memory_bytes: memory at the start of the switch (RSS on CPU, allocated on GPU).
        peak_memory_bytes: highest memory seen during the switch.
        stream_extra_peak_bytes: how far memory rose above its level just before the weights
            were streamed, while streaming: the cost of the transfer itself (gathered buckets and
            any copy the engine makes), excluding the engine's own KV cache and weights.
        push: what the engine was handed: ``full`` weights, LoRA ``adapters`` alone, or full weights
            with the adapters ``merged`` in.
    """

    direction: str
    seconds: float
    bytes_streamed: int
    gather_buffers: int
    retired_buffers: int
    engine_bytes: int
    offloaded_bytes: int
    start_memory_bytes: int
    peak_memory_bytes: int
    stream_extra_peak_bytes: int = 0
    push: str = "full"

    @property
    def extra_peak_bytes(self) -> int:
        return max(0, self.peak_memory_bytes - self.start_memory_bytes)

    def metrics(self, prefix: str = "resharding") -> dict[str, float]:
        lora = {} if self.push == "full" else {f"{prefix}/lora_push_merged": float(self.push == "merged")}
        return {
            **lora,
            f"{prefix}/{self.direction}_s": self.seconds,
            f"{prefix}/{self.direction}_streamed_mb": self.bytes_streamed / 2**20,
            f"{prefix}/{self.direction}_extra_peak_mb": self.extra_peak_bytes / 2**20,
            f"{prefix}/{self.direction}_stream_extra_peak_mb": self.stream_extra_peak_bytes / 2**20,
            f"{prefix}/{self.direction}_retired_buffers": float(self.retired_buffers),
        }


class ReshardingManager:
    """Switches one worker's policy between the training layout and an engine's inference layout.

    Args:
        model: the FSDP2-sharded training model (Hugging Face parameter names underneath).
        engine: the rollout engine to feed; any `RolloutEngine` (vLLM, HF) works unchanged.
        optimizer: the training optimizer, whose state may be offloaded while generating.
        config: the bucket size and whether the KV cache is freed in the training layout.
        device: the training device (where offloaded state returns).
        offload_params: move the FSDP parameter shards to host memory while in the inference layout.
        offload_optimizer: move optimizer state to host memory while in the inference layout.
        weight_dtype: cast streamed weights to this dtype (the engine's), or keep them as they are.
        lora: the model's LoRA adapters, if it has any: the push carries the adapters alone to an engine
            that takes them, else full weights with the adapters merged in.
    """

    def __init__(
        self,
        model: nn.Module,
        engine: RolloutEngine,
        optimizer: torch.optim.Optimizer | None,
        config: ReshardingConfig,
        device: torch.device,
        *,
        offload_params: bool = False,
        offload_optimizer: bool = False,
        weight_dtype: torch.dtype | None = None,
        lora: LoraConfig | None = None,
    ) -> None:
        self.model = model
        self.engine = engine
        self.optimizer = optimizer
        self.config = config
        self.device = device
        self.offload_params = offload_params
        self.offload_optimizer = offload_optimizer
        self.layout = "training"
        self.reports: list[SwitchReport] = []
        self._streamer = WeightStreamer(config.bucket_bytes, device, weight_dtype)
        self._trims_host_memory = device.type == "cpu" and engine.trims_host_memory
        self.lora = lora
        self.push = "full" if lora is None else "adapters" if engine.takes_adapters else "merged"
        self._pushed_bytes = 0

    def __enter__(self) -> RolloutEngine:
        self.to_inference()
        return self.engine

    def __exit__(self, *exc: object) -> None:
        self.to_training()

    def to_inference(self) -> SwitchReport:
        """Offload training state, wake the engine, and stream the current weights into it."""
        if self.layout != "training":
            raise RuntimeError(f"to_inference called in the {self.layout} layout")
        start = time.perf_counter()
        with PeakMemoryTracker(self.device, trim_first=self._trims_host_memory) as tracker:
            offloaded = free_gradients(self.model)
            if self.offload_optimizer and self.optimizer is not None:
                offloaded += offload_optimizer_state(self.optimizer).bytes_moved
            engine_bytes = self.engine.resume()
            switch_start = tracker.start_bytes
            before_stream_peak = tracker.restart()
            self.engine.update_weights(self._stream_weights())
            tracker.sample()
            stream_extra = tracker.extra_peak_bytes
            if self._trims_host_memory:
                # What the engine freed while reloading stays resident in the heap until trimmed.
                return_freed_host_memory()
            if self.offload_params:
                offloaded += offload_fsdp_params(self.model)[0].bytes_moved
        report = SwitchReport(
            "to_inference",
            time.perf_counter() - start,
            self._pushed_bytes,
            self._streamer.buffers_allocated,
            self._streamer.retired_buffers,
            engine_bytes,
            offloaded,
            switch_start,
            max(before_stream_peak, tracker.peak_bytes),
            stream_extra,
            self.push,
        )
        self.layout = "inference"
        self.reports.append(report)
        return report

    def to_training(self) -> SwitchReport:
        """Free the engine's cache (with ``free_kv_cache``) and bring the training state back."""
        if self.layout != "inference":
            raise RuntimeError(f"to_training called in the {self.layout} layout")
        start = time.perf_counter()
        with PeakMemoryTracker(self.device, trim_first=self._trims_host_memory) as tracker:
            engine_bytes = self.engine.release() if self.config.free_kv_cache else 0
            restored = 0
            if self.offload_params:
                restored += load_fsdp_params(self.model, self.device).bytes_moved
            if self.offload_optimizer and self.optimizer is not None:
                restored += load_optimizer_state(self.optimizer, self.device).bytes_moved
        report = SwitchReport(
            "to_training",
            time.perf_counter() - start,
            0,
            0,
            0,
            engine_bytes,
            restored,
            tracker.start_bytes,
            tracker.peak_bytes,
        )
        self.layout = "training"
        self.reports.append(report)
        return report

    def _stream_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self.push == "adapters":
            # Many small tensors: one collective for all of them, not one each.
            weights = self._streamer.stream_packed(self.model, is_adapter_name)
        else:
            weights = self._streamer.stream(self.model)
        if self.push == "merged":
            assert self.lora is not None
            weights = merge_adapters(weights, self.lora.scaling)
        weights = self._counted(weights)
        if not self._trims_host_memory:
            return weights
        # The gather buffer itself is one bucket; allow the engine's transients one more.
        ceiling = current_memory_bytes(self.device) + 2 * self.config.bucket_bytes
        return trim_host_memory_above(weights, ceiling)

    def _counted(self, weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """``weights`` as they are, counting their bytes into ``_pushed_bytes``."""
        self._pushed_bytes = 0
        for name, tensor in weights:
            self._pushed_bytes += tensor_bytes(tensor)
            yield name, tensor
