"""`run_episodes`: many episodes at once, the engine's turns batched, the environments' steps on threads.

The loop keeps two sets of episodes: those waiting for a policy turn and those whose environment step is
running on the thread pool. Each round, every waiting episode gets its next turn in one engine call
(`RolloutEngine.continue_token_lists`, on the episode's exact ids), and its step is submitted to the
pool right away; the loop then takes whatever steps have finished and, if none is waiting, blocks until
one finishes. So one episode's tool call runs while the engine generates other episodes' turns, and the
tool calls of different episodes run side by side.

A turn gets at most the episode's remaining room (`AgentConfig.max_total_tokens`). One engine call
samples every waiting episode up to the largest room among them; an episode with less room keeps only
the first ids of its sample, which is itself a sample of that many ids with the same log-probs, and its
turn then counts as ended by ``"length"``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from hybridflow.agents.codec import Codec
from hybridflow.agents.config import AgentConfig
from hybridflow.agents.environment import Environment, ModelTurn, StepResult
from hybridflow.agents.episode import FINISH_DONE, FINISH_MAX_TOKENS, FINISH_MAX_TURNS, Episode
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.packing import FINISH_LENGTH, FINISH_STOP
from hybridflow.rollout.sampling import SamplingParams

__all__ = ["AgentRollout", "run_episodes"]


@dataclass
class AgentRollout:
    """What `run_episodes` returns.

    Attributes:
        episodes: one per input row, in the rows' order.
        sampling: the sampling every turn was drawn with (``n`` 1; ``max_new_tokens`` the most per turn).
        generation_intervals: ``(start, end)`` monotonic seconds of each engine call.
        wall_seconds: the whole loop's wall time.
    """

    episodes: list[Episode]
    sampling: SamplingParams
    generation_intervals: list[tuple[float, float]] = field(default_factory=list)
    wall_seconds: float = 0.0

    @property
    def generation_seconds(self) -> float:
        return sum(end - start for start, end in self.generation_intervals)


def _step(environment: Environment, turn: ModelTurn) -> StepResult:
    result = environment.step(turn)
    if not isinstance(result, StepResult):
        raise TypeError(
            f"{type(environment).__name__}.step returned {type(result).__name__}, not a StepResult"
        )
    return result


def run_episodes(
    engine: RolloutEngine,
    rows: Sequence[Mapping[str, Any]],
    make_environment: Callable[[], Environment],
    codec: Codec,
    sampling: SamplingParams,
    config: AgentConfig,
) -> AgentRollout:
    """Run one episode per row to its end.

    Args:
        engine: generates the turns; every ``stop_token_ids`` of ``sampling`` and the engine's
            end-of-sequence ids end a turn.
        rows: the data rows; the same row twice gives two independent episodes (a GRPO group).
        make_environment: builds one episode's environment (e.g. ``functools.partial(make_environment,
            "name", **kwargs)``).
        codec: turns starts and observations into ids (`TextCodec` or `ChatCodec`).
        sampling: how each turn is sampled; ``n`` must be 1 (repeat the rows for groups),
            ``max_new_tokens`` bounds one turn.
        config: turn and token limits, tool threads.

    Raises:
        ValueError: a row's first input already fills ``config.max_total_tokens`` (the row is named).
    """
    if sampling.n != 1:
        raise ValueError(
            f"run_episodes samples one turn per episode (sampling.n=1), got n={sampling.n}; repeat the rows"
        )
    start_time = time.monotonic()
    episodes: list[Episode] = []
    for index, row in enumerate(rows):
        environment = make_environment()
        episode = Episode(index=index, row=row, environment=environment, prompt_ids=[])
        episode.prompt_ids = codec.start(environment.start(row), episode.conversation)
        if not 0 < len(episode.prompt_ids) < config.max_total_tokens:
            raise ValueError(
                f"row {index}: the first input has {len(episode.prompt_ids)} ids; it must have at least one "
                f"and leave room under agent.max_total_tokens={config.max_total_tokens}"
            )
        episodes.append(episode)
    rollout = AgentRollout(episodes, dataclasses.replace(sampling, n=1))
    waiting: list[Episode] = list(episodes)
    running: dict[Future[StepResult], tuple[Episode, bool]] = {}
    with ThreadPoolExecutor(max_workers=config.tool_workers, thread_name_prefix="agent-step") as pool:
        while waiting or running:
            if waiting:
                _generate(engine, waiting, sampling, config, codec, pool, running, rollout)
                waiting = []
            finished = [future for future in running if future.done()]
            if not finished and not waiting:
                finished = list(wait(running, return_when=FIRST_COMPLETED).done)
            for future in finished:
                episode, stopped = running.pop(future)
                try:
                    result = future.result()
                except Exception as error:
                    raise RuntimeError(
                        f"row {episode.index}: the environment's step failed: {error}"
                    ) from error
                if _apply_step(episode, result, stopped, codec, config):
                    waiting.append(episode)
    rollout.wall_seconds = time.monotonic() - start_time
    return rollout


def _generate(
    engine: RolloutEngine,
    episodes: list[Episode],
    sampling: SamplingParams,
    config: AgentConfig,
    codec: Codec,
    pool: ThreadPoolExecutor,
    running: dict[Future[StepResult], tuple[Episode, bool]],
    rollout: AgentRollout,
) -> None:
    """One policy turn for each of ``episodes``; submits their steps (or ends those out of room)."""
    rooms = [min(sampling.max_new_tokens, config.max_total_tokens - e.num_tokens) for e in episodes]
    call = dataclasses.replace(sampling, n=1, max_new_tokens=max(rooms))
    began = time.monotonic()
    samples = engine.continue_token_lists([e.ids for e in episodes], call)
    rollout.generation_intervals.append((began, time.monotonic()))
    for episode, room, sample in zip(episodes, rooms, samples, strict=True):
        ids, log_probs = sample.token_ids[:room], sample.log_probs[:room]
        stopped = sample.finish_reason == FINISH_STOP and len(sample.token_ids) <= room
        episode.add_policy_turn(ids, log_probs)
        if episode.num_tokens >= config.max_total_tokens:
            episode.finish = FINISH_MAX_TOKENS
            continue
        text = codec.decode(ids)
        codec.add_turn(ids, text, episode.conversation)
        turn = ModelTurn(tuple(ids), text, FINISH_STOP if stopped else FINISH_LENGTH, episode.turns - 1)
        running[pool.submit(_step, episode.environment, turn)] = (episode, stopped)


def _apply_step(
    episode: Episode, result: StepResult, stopped: bool, codec: Codec, config: AgentConfig
) -> bool:
    """Record a finished step; True when the episode continues (its observation is appended)."""
    if result.reward is not None:
        episode.turn_rewards[-1] = float(result.reward)
    episode.tool_results.extend(result.tool_results)
    if result.done:
        episode.finish = FINISH_DONE
        return False
    if episode.turns >= config.max_turns:
        episode.finish = FINISH_MAX_TURNS
        return False
    if result.observation is None:
        raise ValueError(
            f"row {episode.index}: {type(episode.environment).__name__}.step returned no observation "
            f"for an episode that is not done (turn {episode.turns - 1})"
        )
    inserted = codec.observation(result.observation, stopped, episode.conversation)
    # The next turn needs room for at least one sampled id.
    if episode.num_tokens + len(inserted) >= config.max_total_tokens:
        episode.finish = FINISH_MAX_TOKENS
        return False
    episode.add_inserted(inserted)
    rendered = codec.render(episode.conversation)
    if rendered is not None and rendered != episode.ids:
        episode.drift_turns += 1
    return True
