"""`build_rollout_engine`: the engine that ``rollout.engine`` names."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from hybridflow.lora import LoraConfig
from hybridflow.models.io import load_causal_lm, read_special_token_ids
from hybridflow.parallel.device import process_group_device_plan
from hybridflow.parallel.varlen_attention import VARLEN_SDPA
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.config import ENGINE_NAMES, EngineDerived, RolloutConfig
from hybridflow.rollout.hf_engine import HFRolloutEngine
from hybridflow.rollout.seeding import data_parallel_rank

__all__ = ["build_rollout_engine"]


def build_rollout_engine(
    config: RolloutConfig,
    model_path: str | Path,
    derived: EngineDerived | None = None,
    *,
    model: PreTrainedModel | None = None,
    eos_token_ids: Sequence[int] | None = None,
    pad_token_id: int | None = None,
    device: torch.device | str | None = None,
    lora: LoraConfig | None = None,
) -> RolloutEngine:
    """Build the engine ``config.engine`` names, on the weights in the HF directory ``model_path``.

    Args:
        config: engine settings (the ``rollout`` section).
        model_path: HF model directory the engine starts from.
        derived: the engine's dtype and ``max_model_len`` (a run's come from
            ``trainer.config.derive_values``); None: `EngineDerived`'s defaults.
        model: for ``"hf"`` only: use this model in place instead of loading ``model_path``.
        eos_token_ids, pad_token_id: override the ids read from ``model_path``
            (``read_special_token_ids``).
        device: for ``"hf"`` only: where the model generates; by default this process's device
            (`hybridflow.parallel.process_group_device_plan`: ``cuda:0`` in a GPU worker's nccl group,
            else ``cpu``). The model is moved there, a given ``model`` included. A model loaded here
            for the CPU attends through `hybridflow.parallel.VARLEN_SDPA` (grouped KV heads stay
            shared under the padding mask); a given ``model`` keeps its attention.
        lora: build the engine with these LoRA adapters (zero until the first push), so that a weight
            push carries the adapter tensors alone (``RolloutEngine.takes_adapters``); None: full weights.

    The ``"vllm"`` engine needs an initialised torch.distributed process group and must be built
    on every rank at once (see ``VLLMRolloutEngine``); vLLM is imported only for it.
    """
    derived = derived if derived is not None else EngineDerived()
    if config.engine not in ENGINE_NAMES:
        raise ValueError(f"rollout.engine must be one of {ENGINE_NAMES}, got {config.engine!r}")
    read_eos, read_pad = read_special_token_ids(model_path)
    eos = tuple(eos_token_ids) if eos_token_ids is not None else read_eos
    pad = pad_token_id if pad_token_id is not None else read_pad
    if config.engine == "vllm":
        from hybridflow.rollout.vllm_engine import VLLMRolloutEngine

        return VLLMRolloutEngine(model_path, config, derived, eos, pad, lora=lora)
    if config.tp_size != 1:
        raise ValueError("rollout.tp_size must be 1 for the hf engine (every rank generates alone)")
    target = torch.device(device if device is not None else process_group_device_plan().device)
    if model is None:
        model = load_causal_lm(model_path, getattr(torch, derived.dtype))
        if target.type == "cpu":
            # Left-padded prompts decode under a mask; this attention keeps the grouped KV heads shared
            # there instead of copying the cache per step (`masked_gqa_attention`).
            model.set_attn_implementation(VARLEN_SDPA)
    model = model.to(target)
    return HFRolloutEngine(
        model,
        eos,
        pad,
        seed=config.seed + data_parallel_rank(1),
        max_batch_rows=config.hf_max_batch_rows,
        lora=lora,
    )
