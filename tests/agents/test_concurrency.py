"""Tool calls of different episodes run at the same time, and while the engine generates other
episodes' turns: the test records every call's start and end and every engine call's, and fails if
they ran one after another."""

from __future__ import annotations

import itertools

from hybridflow.agents import AgentConfig, TextCodec, episode_metrics, run_episodes
from hybridflow.rollout import HFRolloutEngine, SamplingParams
from tests.agents._scripted import SleepingEnvironment, SleepTool
from tests.rollout import _tiny

EPISODES = 4
SECONDS = (0.3, 0.6, 0.9, 1.2)  # episode i's tool sleeps SECONDS[i] per call


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def test_tool_calls_overlap_each_other_and_other_episodes_generation():
    tokenizer = _tiny.tokenizer()
    engine = HFRolloutEngine(_tiny.model(), [tokenizer.eos_token_id], tokenizer.pad_token_id, seed=2)
    calls: list[tuple[int, float, float]] = []
    counter = itertools.count()

    def environment() -> SleepingEnvironment:
        episode = next(counter)
        return SleepingEnvironment(SleepTool(SECONDS[episode], calls, episode), turns=2)

    rollout = run_episodes(
        engine,
        [{"prompt": "12+7="}] * EPISODES,
        environment,
        TextCodec(tokenizer),
        SamplingParams(temperature=1.0, max_new_tokens=4),
        AgentConfig(max_turns=2, max_total_tokens=64, tool_workers=EPISODES),
    )
    assert len(calls) == 2 * EPISODES
    # The first calls of all four episodes ran side by side: every pair overlaps by most of the shorter.
    first = {episode: (start, end) for episode, start, end in sorted(calls, key=lambda c: c[1])[::-1]}
    for a, b in itertools.combinations(range(EPISODES), 2):
        assert _overlap(first[a], first[b]) > 0.8 * min(SECONDS[a], SECONDS[b]), (a, b, first)
    # Run one by one they would take sum(SECONDS) * 2 = 6 s of tool time in a row.
    tool_seconds = episode_metrics(rollout)["agent/tool_seconds"]
    assert abs(tool_seconds - 2 * sum(SECONDS)) < 0.5
    # The time some tool call was running (the union of the calls) is far below their sum.
    busy, covered_to = 0.0, float("-inf")
    for _, start, end in sorted(calls, key=lambda c: c[1]):
        busy += max(0.0, end - max(start, covered_to))
        covered_to = max(covered_to, end)
    assert busy < 0.75 * tool_seconds, (busy, tool_seconds)
    # Episode 0's second turn was generated while the slowest episode's first call still slept.
    slow = first[EPISODES - 1]
    assert any(_overlap(interval, slow) > 0 for interval in rollout.generation_intervals[1:])
