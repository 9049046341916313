"""`AgentConfig`: the ``agent`` section: the episodes' environment, codec, limits and concurrency."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridflow.config_fields import FrozenMap, check_bounds, config_field

__all__ = ["AgentConfig"]


@dataclass(frozen=True)
class AgentConfig:
    """How the episode loop runs (docs/agents.md); as the run config's ``agent`` section, a run trains
    on episodes instead of single-turn responses.

    Attributes:
        environment: the registered name of the episodes' environment (`register_environment`).
        environment_kwargs: keyword arguments each episode's environment is built with (for
            ``tool_calls``: ``tools``, ``reward``, ``tool_timeout``).
        codec: how observations become ids: ``text`` (`TextCodec`, tokenised on their own) or ``chat``
            (`ChatCodec`, the tokenizer's chat template by the delta rule).
        max_turns: most policy turns per episode; an episode that reaches it without the environment
            ending it is cut (``finish == "max_turns"``).
        max_total_tokens: most ids per episode, its first prompt included. A turn is given at most the
            room left; an episode that fills it, or whose next observation would not leave room for one
            more policy token, is cut (``finish == "max_tokens"``). At most the engine's
            ``max_model_len``.
        tool_workers: threads that run environment steps (and so tool calls) while the engine
            generates other episodes' turns.
    """

    environment: str = "tool_calls"
    environment_kwargs: Mapping[str, Any] = field(default_factory=FrozenMap)
    codec: Literal["text", "chat"] = "text"
    max_turns: int = config_field(4, ge=1)
    max_total_tokens: int = config_field(1024, ge=2)
    tool_workers: int = config_field(8, ge=1)

    def __post_init__(self) -> None:
        check_bounds(self, "agent")
