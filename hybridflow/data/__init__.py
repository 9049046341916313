"""Prompt datasets in veRL's column layout, their collation into Batches, and synthetic tasks.

- :mod:`~hybridflow.data.schema`: the row layout and its validation;
- :mod:`~hybridflow.data.files`: parquet / jsonl reading and writing;
- :mod:`~hybridflow.data.chat`: chat-template rendering with a plain fallback;
- :mod:`~hybridflow.data.dataset`: :class:`PromptDataset` (validate, template, tokenize, filter);
- :mod:`~hybridflow.data.collate`: :class:`PromptCollator` (left-padded prompt Batches);
- :mod:`~hybridflow.data.sampler`, :mod:`~hybridflow.data.loader`: resumable batch order;
- :mod:`~hybridflow.data.char_tokenizer`: a character tokenizer for tiny models;
- :mod:`~hybridflow.data.synthetic`: task generators and their command line (imported on its own,
  so that ``python -m hybridflow.data.synthetic`` runs it only once).
"""

from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.data.chat import render_plain, render_prompt
from hybridflow.data.collate import PromptCollator
from hybridflow.data.dataset import PromptDataset, read_prompt_rows
from hybridflow.data.files import DataFileError, read_rows, write_rows
from hybridflow.data.loader import PromptLoader
from hybridflow.data.sampler import ResumableBatchSampler
from hybridflow.data.schema import RowFormatError, validate_row

__all__ = [
    "DataFileError",
    "PromptCollator",
    "PromptDataset",
    "PromptLoader",
    "ResumableBatchSampler",
    "RowFormatError",
    "build_char_tokenizer",
    "read_prompt_rows",
    "read_rows",
    "render_plain",
    "render_prompt",
    "validate_row",
    "write_rows",
]
