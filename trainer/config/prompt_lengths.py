"""The one config check that needs the tokenizer: some prompt of each data file list must fit
``data.max_prompt_length``.

It runs before Ray starts (``trainer.main``), once the config itself is valid. The prompts are rendered
and tokenized as `hybridflow.data.PromptDataset` will, a chunk at a time, and the check stops at the first
chunk holding a prompt that fits; only a list in which no prompt fits is tokenized in full, to give its
shortest and longest prompt lengths.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from hybridflow.data import read_prompt_rows, render_prompt
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import load_tokenizer_dir
from trainer.config.problems import ConfigError
from trainer.config.schema import RunConfig

__all__ = ["check_prompts_fit", "prompt_tokenizer"]

# Prompts tokenized per batch: one batch answers the common case (the first prompts fit).
_CHUNK = 256


def prompt_tokenizer(config: RunConfig) -> PreTrainedTokenizerBase:
    """The tokenizer the run's prompts will be tokenized with: ``model.tokenizer``, else ``model.path``'s
    own, else (the tiny model) the character tokenizer."""
    source = config.model.tokenizer or config.model.path
    return load_tokenizer_dir(source) if source is not None else build_char_tokenizer()


def check_prompts_fit(config: RunConfig, tokenizer: PreTrainedTokenizerBase) -> None:
    """Raise a `ConfigError` naming ``data.max_prompt_length`` when no prompt of ``data.train_files``
    (or of ``data.val_files``) is at most that many tokens long, with the shortest and longest length."""
    limit = config.data.max_prompt_length
    problems = []
    files = {"data.train_files": config.data.train_files, "data.val_files": config.data.val_files}
    for key, paths in files.items():
        lengths = _lengths_until_one_fits(paths, config.data.prompt_key, tokenizer, limit)
        if lengths and min(lengths) > limit:
            problems.append(
                f"data.max_prompt_length: {limit} tokens is shorter than every prompt of {key} "
                f"({len(lengths)} prompts: the shortest has {min(lengths)} tokens, the longest {max(lengths)}); "
                f"raise it to at least {min(lengths)}"
            )
    if problems:
        raise ConfigError(problems)


def _lengths_until_one_fits(
    paths: tuple[str, ...], prompt_key: str, tokenizer: PreTrainedTokenizerBase, limit: int
) -> list[int]:
    """Token counts of the prompts in ``paths``, in order, up to the chunk holding the first one of at
    most ``limit`` tokens (all of them when none fits)."""
    lengths: list[int] = []
    for path in paths:
        rows = read_prompt_rows(path, prompt_key)
        for start in range(0, len(rows), _CHUNK):
            texts = [render_prompt(tokenizer, row["prompt"]) for row in rows[start : start + _CHUNK]]
            chunk = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
            lengths.extend(chunk)
            if min(chunk) <= limit:
                return lengths
    return lengths
