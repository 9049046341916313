"""Turning an environment's text and messages into ids, without ever re-tokenising what is already ids.

An episode's ids only grow: the policy's sampled ids are appended as the engine returned them, and each
observation is appended as the ids a codec computes for it alone. Two codecs:

- `TextCodec`: plain text (models without a chat template, such as the character models of the demo);
  an observation's ids are the tokenizer's encoding of its text.
- `ChatCodec`: chat messages through the tokenizer's chat template.

**The rule for chat templates that are not append-only.** Some templates render earlier turns
differently once a later message exists (they strip earlier ``<think>`` blocks, or re-render
separators), so rendering the whole conversation again would change ids the policy already sampled.
`ChatCodec` therefore never renders the episode again. An observation's ids are the *delta* the
template adds for it after a fixed reference conversation (one user and one assistant message, no
reasoning): the text the template writes after the reference assistant's turn-end token, up to and
including the next generation prompt, tokenised once and appended to the episode's exact ids. When the
policy's turn ended without the turn-end token (its token budget ran out), that token is inserted first,
so the next observation starts where the template expects.

**Detecting drift.** After each observation the codec also renders the conversation as the template
would (the decoded text of the policy's turns, the observations' messages) and compares those ids with
the episode's. A mismatch, counted per episode as ``drift_turns``, means a re-rendering trainer would
train on ids the engine never sampled: a template that is not append-only, or sampled ids whose text
tokenises differently. The count is a metric; the episode's ids are the exact ones either way.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from hybridflow.agents.environment import Observation, TokenIds

__all__ = ["ChatCodec", "Codec", "Conversation", "TextCodec"]

# The conversation the observation delta is measured after (see the module docstring).
_REFERENCE = ({"role": "user", "content": "1"}, {"role": "assistant", "content": "2"})


@dataclass
class Conversation:
    """One episode's history as a codec renders it; ``None`` entries once ids were inserted directly
    (the history can no longer be rendered, so drift is no longer checked)."""

    entries: list[Any] | None = field(default_factory=list)


class Codec(abc.ABC):
    """Ids for an episode's start and observations; text for the policy's turns."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def encode_text(self, text: str) -> list[int]:
        """``text`` tokenised without added special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of sampled ids, special tokens dropped (for the environment to read)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @abc.abstractmethod
    def start(self, first: Observation, conversation: Conversation) -> list[int]:
        """The episode's first ids; records ``first`` in ``conversation``."""

    @abc.abstractmethod
    def observation(
        self, observation: Observation, turn_stopped: bool, conversation: Conversation
    ) -> list[int]:
        """The ids to append for ``observation`` after a policy turn (``turn_stopped``: it ended on a
        stop token); records the observation in ``conversation``."""

    @abc.abstractmethod
    def add_turn(self, ids: Sequence[int], text: str, conversation: Conversation) -> None:
        """Record the policy's turn (its sampled ``ids`` and their ``text`` without special tokens) in
        ``conversation``."""

    @abc.abstractmethod
    def render(self, conversation: Conversation) -> list[int] | None:
        """The ids a re-rendering of ``conversation`` gives (None when it cannot be rendered)."""


class TextCodec(Codec):
    """Plain text: the start and each observation are text (or `TokenIds`), tokenised on their own."""

    def _ids(self, value: Observation, conversation: Conversation) -> list[int]:
        if isinstance(value, TokenIds):
            conversation.entries = None
            return list(value.ids)
        if not isinstance(value, str):
            raise TypeError(f"TextCodec takes text or TokenIds, got {type(value).__name__}: {value!r}")
        if conversation.entries is not None:
            conversation.entries.append(value)
        return self.encode_text(value)

    def start(self, first: Observation, conversation: Conversation) -> list[int]:
        return self._ids(first, conversation)

    def observation(
        self, observation: Observation, turn_stopped: bool, conversation: Conversation
    ) -> list[int]:
        return self._ids(observation, conversation)

    def add_turn(self, ids: Sequence[int], text: str, conversation: Conversation) -> None:
        # With its special tokens (a sampled end-of-sequence id is part of the plain-text history).
        if conversation.entries is not None:
            conversation.entries.append(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def render(self, conversation: Conversation) -> list[int] | None:
        return None if conversation.entries is None else self.encode_text("".join(conversation.entries))


def _messages(value: Observation, role: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, Mapping):
        return [dict(value)]
    if isinstance(value, Sequence) and all(isinstance(m, Mapping) for m in value):
        return [dict(m) for m in value]
    raise TypeError(f"ChatCodec takes text, a message, a list of messages or TokenIds, got {value!r}")


class ChatCodec(Codec):
    """Chat messages through the tokenizer's chat template, by the delta rule of the module docstring.

    Args:
        tokenizer: a tokenizer with a chat template.
        observation_role: the role an observation given as plain text gets.
        turn_end: the token that ends an assistant turn in the template (the engine's stop token);
            the tokenizer's end-of-sequence token by default.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, observation_role: str = "tool", turn_end: str | None = None
    ) -> None:
        super().__init__(tokenizer)
        if tokenizer.chat_template is None:
            raise ValueError("ChatCodec needs a tokenizer with a chat template; use TextCodec for plain text")
        self.observation_role = observation_role
        self.turn_end = turn_end if turn_end is not None else tokenizer.eos_token
        self.turn_end_id = tokenizer.convert_tokens_to_ids(self.turn_end)
        reference = self._text(list(_REFERENCE), generation_prompt=False)
        cut = reference.rfind(self.turn_end)
        if cut < 0:
            raise ValueError(
                f"the chat template does not write the turn-end token {self.turn_end!r} after an assistant "
                "message; pass ChatCodec(turn_end=...) naming the token that ends an assistant turn"
            )
        self._reference = reference[: cut + len(self.turn_end)]

    def _text(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )

    def delta(self, messages: list[dict[str, Any]]) -> list[int]:
        """The ids the template adds for ``messages`` after an assistant turn's end token, through the
        next generation prompt (the rule of the module docstring)."""
        full = self._text([*_REFERENCE, *messages], generation_prompt=True)
        if not full.startswith(self._reference):
            raise ValueError(
                "the chat template renders the reference conversation differently once a message follows "
                f"it ({messages[0].get('role')!r}), so no delta rule applies: {full[: len(self._reference)]!r}"
            )
        return self.encode_text(full[len(self._reference) :])

    def start(self, first: Observation, conversation: Conversation) -> list[int]:
        if isinstance(first, TokenIds):
            conversation.entries = None
            return list(first.ids)
        messages = _messages(first, "user")
        conversation.entries = list(messages)
        return self.encode_text(self._text(messages, generation_prompt=True))

    def observation(
        self, observation: Observation, turn_stopped: bool, conversation: Conversation
    ) -> list[int]:
        closing = [] if turn_stopped else [self.turn_end_id]
        if isinstance(observation, TokenIds):
            conversation.entries = None
            return closing + list(observation.ids)
        messages = _messages(observation, self.observation_role)
        if conversation.entries is not None:
            conversation.entries.extend(messages)
        return closing + self.delta(messages)

    def add_turn(self, ids: Sequence[int], text: str, conversation: Conversation) -> None:
        # The template writes the turn-end token itself.
        if conversation.entries is not None:
            conversation.entries.append({"role": "assistant", "content": text})

    def render(self, conversation: Conversation) -> list[int] | None:
        if conversation.entries is None:
            return None
        return self.encode_text(self._text(conversation.entries, generation_prompt=True))
