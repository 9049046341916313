"""Turning a list of chat messages into the prompt text a model is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["PLAIN_GENERATION_PROMPT", "render_plain", "render_prompt"]

PLAIN_GENERATION_PROMPT = "assistant: "


def render_plain(messages: Sequence[Mapping[str, str]]) -> str:
    """The fallback template for tokenizers without a chat template.

    Each message becomes ``"{role}: {content}\\n"``, followed by ``"assistant: "`` so the model
    continues as the assistant.
    """
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + PLAIN_GENERATION_PROMPT


def render_prompt(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> str:
    """The prompt text for ``messages``: the tokenizer's chat template with the generation prompt.

    Tokenizers without a chat template (``tokenizer.chat_template`` is None) get :func:`render_plain`.
    """
    if getattr(tokenizer, "chat_template", None) is None:
        return render_plain(messages)
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
