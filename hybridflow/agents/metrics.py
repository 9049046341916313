"""`episode_metrics`: what a multi-turn rollout did, as scalars for the step's metrics."""

from __future__ import annotations

from hybridflow.agents.episode import FINISH_MAX_TOKENS, FINISH_MAX_TURNS
from hybridflow.agents.loop import AgentRollout
from hybridflow.tools.base import ToolOutcome

__all__ = ["episode_metrics"]


def episode_metrics(rollout: AgentRollout, prefix: str = "agent/") -> dict[str, float]:
    """Scalars over the rollout's episodes.

    - ``turns_mean``, ``turns_max``: policy turns per episode;
    - ``tool_calls``, ``tool_errors``, ``tool_timeouts``: counts over all episodes;
    - ``tool_seconds``: the tool calls' seconds summed (they overlap, so this can exceed the wall time);
    - ``generation_seconds``: wall seconds inside engine calls; ``wall_seconds``: the whole loop;
    - ``masked_token_share``: share of response ids with no loss (inserted by the environment);
    - ``cut_max_turns``, ``cut_max_tokens``: episodes cut by each limit;
    - ``drift_turns``: observations after which a re-rendering differed from the ledger;
    - ``reward_mean``: the episodes' mean reward.
    """
    episodes = rollout.episodes
    calls = [result for episode in episodes for result in episode.tool_results]
    response_ids = sum(len(e.response_ids) for e in episodes)
    inserted = sum(len(e.policy_mask) - sum(e.policy_mask) for e in episodes)
    turns = [e.turns for e in episodes]
    values = {
        "turns_mean": sum(turns) / len(turns),
        "turns_max": float(max(turns)),
        "tool_calls": float(len(calls)),
        "tool_errors": float(sum(r.outcome == ToolOutcome.ERROR for r in calls)),
        "tool_timeouts": float(sum(r.outcome == ToolOutcome.TIMEOUT for r in calls)),
        "tool_seconds": float(sum(r.seconds for r in calls)),
        "generation_seconds": rollout.generation_seconds,
        "wall_seconds": rollout.wall_seconds,
        "masked_token_share": inserted / response_ids if response_ids else 0.0,
        "cut_max_turns": float(sum(e.finish == FINISH_MAX_TURNS for e in episodes)),
        "cut_max_tokens": float(sum(e.finish == FINISH_MAX_TOKENS for e in episodes)),
        "drift_turns": float(sum(e.drift_turns for e in episodes)),
        "reward_mean": sum(e.reward for e in episodes) / len(episodes),
    }
    return {prefix + name: value for name, value in values.items()}
