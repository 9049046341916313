"""Held-out accuracy and tool-call rate of episodes, for `fit`'s ``evaluate=`` hook and for `probe`.

The episodes are those of `recipes.tool_arithmetic.evaluation.held_out_episodes`: one per held-out
prompt with the run's ``agent`` section, at ``rollout.val_sampling`` (greedy by default). In the
``tool_calls`` environment a turn without a call ends the episode, so an episode **called the tool**
exactly when it has more than one turn.
"""

from __future__ import annotations

import time

import torch

from recipes.tool_arithmetic.evaluation import held_out_episodes
from trainer.fit import Evaluate, Progress
from trainer.runtime import Runtime

__all__ = ["held_out_evaluation", "summarise"]


def summarise(scores: torch.Tensor, num_turns: torch.Tensor) -> dict[str, float]:
    """``eval/accuracy`` (share of episodes scoring 1), ``eval/tool_call_rate`` (share with more than one
    turn), ``eval/call_accuracy`` (accuracy among those; 0 when none called) and ``eval/turns_mean``, over
    episodes with ``scores [rows]`` and ``num_turns [rows]``."""
    correct, called = scores >= 1.0, num_turns > 1
    return {
        "eval/accuracy": correct.float().mean().item(),
        "eval/tool_call_rate": called.float().mean().item(),
        "eval/call_accuracy": (correct & called).sum().item() / max(int(called.sum()), 1),
        "eval/turns_mean": num_turns.float().mean().item(),
    }


def held_out_evaluation(started: float) -> Evaluate:
    """`fit`'s ``evaluate=``: `summarise` of the held-out episodes, plus ``eval/wall_s`` (seconds from
    ``started``, a `time.monotonic` reading, to the evaluation's start)."""

    def evaluate(runtime: Runtime, progress: Progress) -> dict[str, float]:
        wall = time.monotonic() - started
        episodes = held_out_episodes(runtime)
        return {**summarise(episodes["scores"], episodes["num_turns"]), "eval/wall_s": wall}

    return evaluate
