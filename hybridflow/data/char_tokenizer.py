"""A character-level tokenizer for tiny models on synthetic tasks.

Every character of the alphabet is one token; there are no merges. The tokenizer is a regular
``transformers.PreTrainedTokenizerFast`` built in code from the ``tokenizers`` library, so
``save_pretrained`` writes a ``tokenizer.json`` that ``hybridflow.models.load_tokenizer_dir`` reads back
as written (``AutoTokenizer`` next to a Qwen2 ``config.json`` would pick ``Qwen2Tokenizer`` and drop
spaces).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

__all__ = ["CHAR_CHAT_TEMPLATE", "DEFAULT_ALPHABET", "SPECIAL_TOKENS", "build_char_tokenizer"]

# Printable ASCII and the newline: enough for arithmetic prompts with instructions and tags.
DEFAULT_ALPHABET = "".join(chr(c) for c in range(32, 127)) + "\n"

# Fixed ids 0..3, so models built for the tokenizer can hard-code them.
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}

# The messages' contents, back to back, and nothing after: a tiny model sees "12+34=" and answers.
CHAR_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, model_max_length: int = 4096
) -> PreTrainedTokenizerFast:
    """A character tokenizer: ids 0-3 are ``<pad> <s> </s> <unk>``, then one id per alphabet character.

    Characters outside the alphabet encode to ``<unk>``. Encoding adds no special tokens; padding is
    on the left (as prompts for generation need).

    Args:
        alphabet: the characters, each becoming one token in this order; duplicates are an error.
        model_max_length: the longest sequence the tokenizer reports as supported, in tokens.
    """
    duplicates = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if duplicates:
        raise ValueError(f"alphabet repeats the characters {duplicates}")
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS.values())}
    vocab.update({char: len(SPECIAL_TOKENS) + i for i, char in enumerate(alphabet)})
    # A BPE model without merges splits text into single characters and maps each to its id.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIAL_TOKENS["unk_token"]))
    # Without a decoder, decoding would join the characters with spaces.
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        chat_template=CHAR_CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="left",
        **SPECIAL_TOKENS,
    )
