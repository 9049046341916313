"""Multi-turn episodes: environments, exact-token ledgers, and the loop that runs many episodes at once.

- `environment`: the episode interface (`Environment`: ``start(row)``, ``step(turn)``) and its registry;
- `codec`: ids for starts and observations (`TextCodec`, `ChatCodec` and its rule for templates that
  are not append-only);
- `episode`: `Episode`, the token ledger (exact ids, policy mask, engine log-probs);
- `loop`: `run_episodes`, turns batched on the engine, steps on a thread pool;
- `batch`: `episode_rows` (a prompt Batch's rows) and `episodes_to_batch`, the rollout Batch with
  ``loss_mask``;
- `metrics`: `episode_metrics`;
- `tool_env`: ``tool_calls``, tools called by tags with a reward on the answer.

See docs/agents.md.
"""

from hybridflow.agents.batch import EPISODE_COLUMNS, episode_rows, episodes_to_batch
from hybridflow.agents.codec import ChatCodec, Codec, Conversation, TextCodec
from hybridflow.agents.config import AgentConfig
from hybridflow.agents.environment import (
    ENVIRONMENTS,
    Environment,
    ModelTurn,
    Observation,
    StepResult,
    TokenIds,
    get_environment,
    make_environment,
    register_environment,
)
from hybridflow.agents.episode import FINISH_DONE, FINISH_MAX_TOKENS, FINISH_MAX_TURNS, Episode
from hybridflow.agents.loop import AgentRollout, run_episodes
from hybridflow.agents.metrics import episode_metrics
from hybridflow.agents.tool_env import ToolCallEnvironment, find_tool_call

__all__ = [
    "ENVIRONMENTS",
    "EPISODE_COLUMNS",
    "FINISH_DONE",
    "FINISH_MAX_TOKENS",
    "FINISH_MAX_TURNS",
    "AgentConfig",
    "AgentRollout",
    "ChatCodec",
    "Codec",
    "Conversation",
    "Environment",
    "Episode",
    "ModelTurn",
    "Observation",
    "StepResult",
    "TextCodec",
    "TokenIds",
    "ToolCallEnvironment",
    "episode_metrics",
    "episode_rows",
    "episodes_to_batch",
    "find_tool_call",
    "get_environment",
    "make_environment",
    "register_environment",
    "run_episodes",
]
