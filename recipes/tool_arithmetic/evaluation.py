"""Held-out evaluation with greedy episodes: accuracy and tool-call rate, for `trainer.fit.fit`'s
``evaluate=`` hook.

Every held-out prompt (``data.val_files``) runs one episode of the run's environment (``agent``
section: the same environment, keywords and limits as training, so the baseline is measured without
the tool and the tool run with it) at the configured validation sampling (``rollout.val_sampling``:
greedy by default), on the actor's engine.
"""

from __future__ import annotations

import functools
import time

import torch

from hybridflow.agents import get_environment
from hybridflow.data import PromptLoader
from hybridflow.protocol import Batch
from recipes.tool_arithmetic.environment import wrote_call
from trainer.agent_rollout import build_codec
from trainer.fit import Evaluate, Progress
from trainer.runtime import Runtime
from trainer.steps import actor_batch, decode_responses, sampling_from

__all__ = ["EVAL_METRICS", "episode_evaluation", "held_out_episodes", "summarise"]

EVAL_METRICS = ("eval/accuracy", "eval/tool_call_rate", "eval/call_accuracy", "eval/turns_mean")


def held_out_episodes(runtime: Runtime) -> Batch:
    """One greedy episode per held-out prompt (module docstring), with ``response_text``: the episode's
    ids after the prompt, observations included, decoded."""
    agent = runtime.config.agent
    if agent is None or runtime.val_data is None:
        raise ValueError("the tool_arithmetic evaluation needs an agent section and data.val_files")
    rollout = runtime.config.rollout
    sampling = sampling_from(rollout.val_sampling, runtime, rollout.seed)
    environment = functools.partial(get_environment(agent.environment), **agent.environment_kwargs)
    codec = build_codec(agent, runtime.tokenizer)
    data = runtime.config.data
    loader = PromptLoader(
        runtime.val_data,
        data.val_batch_size,
        runtime.tokenizer.pad_token_id,
        shuffle=False,
        drop_last=False,
        pad_to=data.max_prompt_length,  # equal widths, so the batches concatenate
    )
    batches = []
    for prompts in loader:
        sent = actor_batch(runtime, prompts, *prompts.keys())
        episodes = runtime.actor.generate_episodes(sent, sampling, agent, environment, codec)
        episodes.meta.pop("rollout_metrics", None)
        batches.append(episodes | decode_responses(episodes, runtime.tokenizer))
    return Batch.concat(batches)


def summarise(scores: torch.Tensor, texts: list[str], turns: torch.Tensor) -> dict[str, float]:
    """``eval/accuracy`` (share of episodes scoring 1), ``eval/tool_call_rate`` (share whose text holds a
    complete call), ``eval/call_accuracy`` (accuracy among those; 0 when none called) and
    ``eval/turns_mean``, over episodes with ``scores [rows]``, decoded ``texts`` and ``turns [rows]``."""
    correct = scores >= 1.0
    called = torch.tensor([wrote_call(text) for text in texts])
    return {
        "eval/accuracy": correct.float().mean().item(),
        "eval/tool_call_rate": called.float().mean().item(),
        "eval/call_accuracy": (correct & called).sum().item() / max(int(called.sum()), 1),
        "eval/turns_mean": turns.float().mean().item(),
    }


def episode_evaluation(started: float) -> Evaluate:
    """`fit`'s ``evaluate=``: `summarise` of `held_out_episodes`, plus ``eval/wall_s`` (seconds from
    ``started``, a `time.monotonic` reading, to the evaluation's start)."""

    def evaluate(runtime: Runtime, progress: Progress) -> dict[str, float]:
        wall = time.monotonic() - started
        episodes = held_out_episodes(runtime)
        metrics = summarise(episodes["scores"], list(episodes["response_text"]), episodes["num_turns"])
        return {**metrics, "eval/wall_s": wall}

    return evaluate
