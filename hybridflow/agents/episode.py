"""`Episode`: the token ledger of one multi-turn rollout.

The ledger is the exact ids the model was conditioned on and sampled: the first prompt, then every
policy turn as the engine returned it and every inserted observation, in order. Beside each id after the
prompt it keeps whether the policy sampled it (``policy_mask``, the future ``loss_mask``) and the
engine's log-prob of it (0 at inserted ids).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agents.codec import Conversation
from hybridflow.agents.environment import Environment
from hybridflow.tools.base import ToolResult

__all__ = ["FINISH_DONE", "FINISH_MAX_TOKENS", "FINISH_MAX_TURNS", "Episode"]

FINISH_DONE = "done"
FINISH_MAX_TURNS = "max_turns"
FINISH_MAX_TOKENS = "max_tokens"


@dataclass
class Episode:
    """One episode's ledger and counters.

    Attributes:
        index: the episode's row in the rollout (the order of the input rows).
        row: the data row it started from.
        environment: its environment.
        prompt_ids: the first input's ids.
        response_ids: every id after the prompt, sampled or inserted.
        policy_mask: 1 where the policy sampled the id, 0 where the environment inserted it.
        log_probs: the engine's log-prob (nats) of each sampled id, 0.0 at inserted ids.
        turn_ends: for each policy turn, the index in ``response_ids`` just past its last id.
        turn_rewards: each turn's reward (0.0 where the step gave none, or the turn was not stepped).
        finish: ``"done"``, ``"max_turns"`` or ``"max_tokens"``; None while running.
        tool_results: every tool call the environment reported.
        drift_turns: observations after which a re-rendering of the conversation differed from the
            ledger (see `hybridflow.agents.codec`).
    """

    index: int
    row: Mapping[str, Any]
    environment: Environment
    prompt_ids: list[int]
    conversation: Conversation = field(default_factory=Conversation)
    response_ids: list[int] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    finish: str | None = None
    tool_results: list[ToolResult] = field(default_factory=list)
    drift_turns: int = 0

    @property
    def ids(self) -> list[int]:
        """The whole ledger: prompt then response ids."""
        return self.prompt_ids + self.response_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def turns(self) -> int:
        return len(self.turn_ends)

    @property
    def reward(self) -> float:
        """The episode's score: the sum of its turns' rewards."""
        return float(sum(self.turn_rewards))

    def add_policy_turn(self, ids: Sequence[int], log_probs: Sequence[float]) -> None:
        """Append a sampled turn: its ids, their engine log-probs, mask 1."""
        if len(ids) != len(log_probs):
            raise ValueError(
                f"episode {self.index}: a turn of {len(ids)} ids came with {len(log_probs)} log-probs"
            )
        self.response_ids.extend(int(i) for i in ids)
        self.log_probs.extend(float(lp) for lp in log_probs)
        self.policy_mask.extend([1] * len(ids))
        self.turn_ends.append(len(self.response_ids))
        self.turn_rewards.append(0.0)

    def add_inserted(self, ids: Sequence[int]) -> None:
        """Append ids the environment inserted: mask 0, log-prob 0."""
        self.response_ids.extend(int(i) for i in ids)
        self.log_probs.extend([0.0] * len(ids))
        self.policy_mask.extend([0] * len(ids))
