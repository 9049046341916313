"""Reading and writing Hugging Face model directories (the format vLLM loads)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

__all__ = ["load_causal_lm", "read_special_token_ids", "save_model_dir"]


def save_model_dir(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, path: str | Path
) -> Path:
    """Write ``model`` (safetensors, config, generation config) and ``tokenizer`` into ``path``.

    The directory is what ``vllm.LLM(model=path)`` and ``load_causal_lm(path)`` read. Returns the path.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def load_causal_lm(
    path_or_name: str | Path, dtype: torch.dtype = torch.float32, local_files_only: bool = True
) -> PreTrainedModel:
    """A causal LM from an HF directory (or a cached hub name), in ``dtype``, in eval mode.

    ``local_files_only`` defaults to True because the machines this runs on are often offline; a
    missing directory should fail at once rather than after network timeouts.
    """
    model = AutoModelForCausalLM.from_pretrained(
        str(path_or_name), dtype=dtype, local_files_only=local_files_only
    )
    return model.eval()


def read_special_token_ids(path: str | Path) -> tuple[tuple[int, ...], int]:
    """``(eos_token_ids, pad_token_id)`` of an HF model directory.

    End-of-sequence ids come from ``generation_config.json`` (which may list several, as chat models
    do), else from ``config.json``. The pad id falls back to the first end-of-sequence id, the usual
    convention for models trained without padding.
    """
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    try:
        generation = GenerationConfig.from_pretrained(str(path), local_files_only=True)
    except OSError:
        generation = None
    eos = getattr(generation, "eos_token_id", None)
    if eos is None:
        eos = config.eos_token_id
    if eos is None:
        raise ValueError(f"{path} names no eos_token_id in generation_config.json or config.json")
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
    pad = getattr(generation, "pad_token_id", None)
    if pad is None:
        pad = getattr(config, "pad_token_id", None)
    return eos_ids, eos_ids[0] if pad is None else int(pad)
