"""`AgentConfig`: the limits and the concurrency of multi-turn episodes."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config_fields import check_bounds, config_field

__all__ = ["AgentConfig"]


@dataclass(frozen=True)
class AgentConfig:
    """How the episode loop runs (docs/agents.md).

    Attributes:
        max_turns: most policy turns per episode; an episode that reaches it without the environment
            ending it is cut (``finish == "max_turns"``).
        max_total_tokens: most ids per episode, its first prompt included. A turn is given at most the
            room left; an episode that fills it, or whose next observation would not leave room for one
            more policy token, is cut (``finish == "max_tokens"``). At most the engine's
            ``max_model_len``.
        tool_workers: threads that run environment steps (and so tool calls) while the engine
            generates other episodes' turns.
    """

    max_turns: int = config_field(4, ge=1)
    max_total_tokens: int = config_field(1024, ge=2)
    tool_workers: int = config_field(8, ge=1)

    def __post_init__(self) -> None:
        check_bounds(self, "agent")
