"""Loading HF causal LMs, and small-model builders for tests and demos.

For a tokenizer to go with the tiny models, see ``hybridflow.data.char_tokenizer.build_char_tokenizer``
(its special ids 0-3 match ``build_tiny_causal_lm``'s defaults).
"""

from hybridflow.models.io import load_causal_lm, read_special_token_ids, save_model_dir
from hybridflow.models.tiny import build_tiny_causal_lm

__all__ = ["build_tiny_causal_lm", "load_causal_lm", "read_special_token_ids", "save_model_dir"]
