"""The policy's starting Hugging Face directory: the configured one, or a tiny model built once."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, load_tokenizer_dir, save_model_dir
from trainer.config import RunConfig

__all__ = ["load_tokenizer", "prepare_model_dir"]


def load_tokenizer(config: RunConfig, model_dir: Path) -> PreTrainedTokenizerBase:
    """The tokenizer named by ``model.tokenizer``, else the model directory's own."""
    return load_tokenizer_dir(config.model.tokenizer or model_dir)


def prepare_model_dir(config: RunConfig, output_dir: Path) -> Path:
    """``model.path`` when set; otherwise the tiny model of ``model.tiny`` with the character
    tokenizer, written to ``output_dir/initial_model`` on first use and reused afterwards."""
    if config.model.path is not None:
        return Path(config.model.path)
    target = output_dir / "initial_model"
    spec = json.dumps(asdict(config.model.tiny), sort_keys=True)
    marker = target / "tiny_spec.json"
    if marker.exists() and marker.read_text() == spec:
        return target
    tokenizer = load_tokenizer_dir(config.model.tokenizer) if config.model.tokenizer else build_char_tokenizer()
    tiny = config.model.tiny
    model = build_tiny_causal_lm(
        vocab_size=tiny.vocab_size or len(tokenizer),
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        intermediate_size=tiny.intermediate_size,
        max_position_embeddings=tiny.max_position_embeddings,
        seed=tiny.seed,
        initializer_range=tiny.initializer_range,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    save_model_dir(model, tokenizer, target)
    marker.write_text(spec)
    return target
