"""Reading and writing Hugging Face model directories (the format vLLM loads)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

__all__ = ["load_causal_lm", "load_tokenizer_dir", "read_special_token_ids", "save_model_dir"]

# What tokenizer_config.json names for a tokenizer defined wholly by its tokenizer.json.
_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


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


def load_tokenizer_dir(path_or_name: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in a model directory (or a hub name), as it was saved.

    ``AutoTokenizer`` prefers the class registered for the model type of the directory's
    ``config.json``, which builds its pre-tokenizer from its own rules: a tokenizer saved as a generic
    one (``tokenizer_class`` ``TokenizersBackend``, as `hybridflow.data.build_char_tokenizer` is) next
    to a Qwen2 model would come back as ``Qwen2Tokenizer`` and drop every space. A generic tokenizer is
    therefore read from its ``tokenizer.json`` as written; any other goes through ``AutoTokenizer``.
    """
    tokenizer_config = Path(path_or_name) / "tokenizer_config.json"
    if tokenizer_config.is_file():
        saved_class = json.loads(tokenizer_config.read_text()).get("tokenizer_class")
        if saved_class in _GENERIC_TOKENIZER_CLASSES:
            return PreTrainedTokenizerFast.from_pretrained(str(path_or_name))
    return AutoTokenizer.from_pretrained(str(path_or_name))


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
