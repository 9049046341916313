"""Multi-turn episodes on the real vLLM engine (CPU build), run in a rank process by `test_vllm_episodes`."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from hybridflow.agents import AgentConfig, TextCodec, episodes_to_batch, make_environment, run_episodes
from hybridflow.models import load_causal_lm
from hybridflow.rollout import (
    EngineDerived,
    SamplingParams,
    build_rollout_engine,
    response_log_probs,
)
from tests.agents import _scripted  # registers test_counting
from tests.rollout import _tiny

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=6)
PROMPTS = ("12+7=", "3*(4-1)=", "a", "ab+cd*9=")


def episode_checks(rank: int, world_size: int, model_dir: Path) -> dict[str, Any]:
    config = _tiny.vllm_config()
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=128))
    tokenizer = _tiny.tokenizer()
    rollout = run_episodes(
        engine,
        [{"prompt": p} for p in PROMPTS for _ in range(2)],
        functools.partial(make_environment, "test_counting", turns=3),
        TextCodec(tokenizer),
        SAMPLING,
        AgentConfig(max_turns=5, max_total_tokens=64),
    )
    batch = episodes_to_batch(rollout, tokenizer.pad_token_id)
    results: dict[str, Any] = {
        "expected": [],
        "responses": [],
        "expected_mask": [],
        "loss_mask": [],
        "finish": [],
    }
    for row, episode in enumerate(rollout.episodes):
        environment = episode.environment
        assert isinstance(environment, _scripted.CountingEnvironment)
        expected, mask = [], []
        for i, turn in enumerate(environment.turns):
            expected += list(turn.token_ids)
            mask += [1.0] * len(turn.token_ids)
            if i < len(environment.observations):
                inserted = tokenizer.encode(environment.observations[i], add_special_tokens=False)
                expected += inserted
                mask += [0.0] * len(inserted)
        length = int(batch["response_lengths"][row])
        results["expected"].append(expected)
        results["responses"].append(batch["responses"][row, :length].tolist())
        results["expected_mask"].append(mask)
        results["loss_mask"].append(batch["loss_mask"][row, :length].tolist())
        results["finish"].append(episode.finish)
    recomputed = response_log_probs(load_causal_lm(model_dir), batch, SAMPLING)
    policy = batch["loss_mask"].bool()
    results["lp_gap_max"] = float((recomputed - batch["rollout_log_probs"])[policy].abs().max())
    results["policy_tokens"] = int(policy.sum())
    return results
