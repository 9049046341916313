"""Estimating a checkpoint's size before it is written (for the disk-full message)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["training_state_bytes"]

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")

# Model weights plus AdamW's two moment tensors, each the size of the weights.
_COPIES_PER_TRAINED_MODEL = 3


def training_state_bytes(model_dir: str | Path, trained_models: int = 1) -> int:
    """Approximate bytes of the distributed checkpoint of ``trained_models`` models shaped like the one
    in ``model_dir`` (a Hugging Face folder), each trained with AdamW: three copies of its weight files."""
    weights = sum(
        path.stat().st_size for path in Path(model_dir).glob("*") if path.suffix in _WEIGHT_SUFFIXES
    )
    return _COPIES_PER_TRAINED_MODEL * trained_models * weights
