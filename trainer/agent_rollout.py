"""`agent_generate`: the rollout step of a run with an ``agent`` section: episodes instead of responses.

Layer: steps (it builds on `trainer.steps`; `trainer.algorithms.rl_step` calls it). The actor workers run
the episodes (`ActorRolloutRefWorker.generate_episodes`); the controller resolves the environment by
name (a recipe's registration is seen here), builds the codec on the run's tokenizer, and turns each
episode's reward into the step's reward columns, so the rest of the step (log-probs, reference,
advantages, update) runs as for single-turn rollouts, with ``loss_mask`` limiting every loss term to the
policy's ids.
"""

from __future__ import annotations

import functools

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.agents import AgentConfig, ChatCodec, Codec, TextCodec, get_environment
from hybridflow.contract import step_columns
from hybridflow.protocol import Batch
from trainer.runtime import Runtime
from trainer.steps import GENERATED_METRIC, actor_batch, add_group_ids, decode_responses, sampling_params

__all__ = ["agent_generate", "build_codec", "episode_scores"]


def build_codec(agent: AgentConfig, tokenizer: PreTrainedTokenizerBase) -> Codec:
    """The codec ``agent.codec`` names, on ``tokenizer``."""
    return ChatCodec(tokenizer) if agent.codec == "chat" else TextCodec(tokenizer)


def episode_scores(rollouts: Batch) -> Batch:
    """``token_level_scores [rows, response_len]``: each episode's ``scores`` (the sum of its turns'
    rewards) at its last response id, 0 elsewhere, as a single-turn step places a response's score.

    An episode's ledger always ends on a policy id (`run_episodes` inserts no observation after the last
    turn), so the score sits on a trained token.
    """
    lengths = rollouts["response_mask"].sum(dim=1)
    token_level = torch.zeros(rollouts["response_mask"].shape, dtype=torch.float32)
    rows = torch.arange(len(rollouts))
    token_level[rows, (lengths - 1).clamp(min=0)] = rollouts["scores"].float()
    return Batch({"token_level_scores": token_level})


@step_columns(
    reads=("input_ids", "attention_mask"),
    writes=("responses", "response_mask", "loss_mask", "sampled_mask", "scores", "token_level_scores", "group_ids"),
)
def agent_generate(runtime: Runtime, prompts: Batch) -> Batch:
    """``rollout.n`` episodes per prompt with the ``agent`` section's environment, scored by it.

    Returns the columns of `hybridflow.agents.episodes_to_batch` (``loss_mask`` 1 on the policy's ids,
    ``rollout_log_probs``, ``scores``, ``turn_rewards``, ...), ``token_level_scores`` (`episode_scores`),
    ``group_ids`` and ``response_text`` (the whole ledger after the prompt, observations included).
    Each turn is sampled with the step's sampling (`trainer.steps.sampling_params`; at most
    ``data.max_response_length`` ids per turn). Records the ``agent/*`` metrics and counts the policy's
    ids in ``response/generated_tokens``.
    """
    agent = runtime.config.agent
    if agent is None:
        raise RuntimeError("agent_generate: the run has no agent section (set agent in the config)")
    sampling = sampling_params(runtime)
    environment = functools.partial(get_environment(agent.environment), **agent.environment_kwargs)
    codec = build_codec(agent, runtime.tokenizer)
    sent = actor_batch(runtime, prompts, *prompts.keys())
    with runtime.timer.phase("generation"):
        rollouts = runtime.actor.generate_episodes(sent, sampling, agent, environment, codec)
    runtime.record(rollouts.meta.pop("rollout_metrics"))
    runtime.record(
        {GENERATED_METRIC: runtime.step_metrics.get(GENERATED_METRIC, 0.0) + float(rollouts["sampled_mask"].sum())}
    )
    return (
        rollouts
        | episode_scores(rollouts)
        | add_group_ids(rollouts, sampling.n)
        | decode_responses(rollouts, runtime.tokenizer)
    )
