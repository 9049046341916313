"""`episodes_to_batch`: episodes as the rollout Batch every trainer step reads.

The first prompt is the prompt columns; everything after it (sampled turns and inserted observations)
is the response, so the training forward runs over exactly the ids of the ledger. ``response_mask`` is 1
on every ledger id (the forward attends to the observations too); ``loss_mask`` is 1 only on the
policy's ids, so no loss and no KL term counts an inserted id (`hybridflow.contract.loss_response_mask`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.agents.environment import TokenIds
from hybridflow.agents.loop import AgentRollout
from hybridflow.protocol import Batch

__all__ = ["EPISODE_COLUMNS", "episode_rows", "episodes_to_batch"]

EPISODE_COLUMNS = {
    "loss_mask": "[rows, response_len] float: 1 on the policy's sampled ids, 0 on inserted ids and padding",
    "sampled_mask": "[rows, response_len] int64: 1 on the policy's sampled ids, 0 on inserted ids and padding",
    "turn_rewards": "[rows, response_len] float: each turn's reward at the turn's last sampled id, 0 elsewhere",
    "scores": "[rows] float: the episode's reward, the sum of its turns' rewards",
    "num_turns": "[rows] int64: policy turns in the episode",
    "episode_finish": "non-tensor: 'done', 'max_turns' or 'max_tokens'",
}
"""The columns `episodes_to_batch` adds to the standard prompt and response columns."""


def episode_rows(prompts: Batch, samples_per_prompt: int) -> list[dict[str, Any]]:
    """The data rows of a prompt Batch, each repeated ``samples_per_prompt`` times in a row (a group).

    Each row's ``prompt`` is `TokenIds` of the prompt's ids (``input_ids`` where ``attention_mask`` is 1),
    so an episode starts from exactly the ids a single-turn rollout of the prompt starts from; the
    Batch's non-tensor columns (``raw_prompt``, ``ground_truth``, ``data_source``, ...) come along by
    name.
    """
    rows = []
    for index in range(len(prompts)):
        ids = prompts["input_ids"][index][prompts["attention_mask"][index].bool()].tolist()
        extra = {key: values[index] for key, values in prompts.non_tensors.items()}
        rows.extend({**extra, "prompt": TokenIds(tuple(ids))} for _ in range(samples_per_prompt))
    return rows


def episodes_to_batch(
    rollout: AgentRollout,
    pad_token_id: int,
    response_width: int | None = None,
    prompt_width: int | None = None,
) -> Batch:
    """One row per episode, in the rollout's order.

    Args:
        rollout: the output of `run_episodes`.
        pad_token_id: fills the prompt (on the left) and the response (on the right).
        response_width: width of the response columns (fixed so Batches of several ranks concat); by
            default the longest episode's response.
        prompt_width: width of the prompt columns, likewise; by default the longest first input.

    Returns:
        ``input_ids``/``attention_mask [rows, prompt_len]`` (left-padded), ``responses``/``response_mask``
        ``[rows, response_len]`` (right-padded), ``rollout_log_probs [rows, response_len]`` (float32, 0 at
        inserted ids and padding), ``response_lengths [rows]`` and the `EPISODE_COLUMNS`.
    """
    episodes = rollout.episodes
    if not episodes:
        raise ValueError("episodes_to_batch needs at least one episode")
    longest = max(len(e.response_ids) for e in episodes)
    width = longest if response_width is None else response_width
    if longest > width:
        raise ValueError(f"an episode has {longest} response ids, more than response_width={width}")
    longest_prompt = max(len(e.prompt_ids) for e in episodes)
    prompt_width = longest_prompt if prompt_width is None else prompt_width
    if longest_prompt > prompt_width:
        raise ValueError(
            f"an episode's first input has {longest_prompt} ids, more than prompt_width={prompt_width}"
        )
    rows = len(episodes)
    input_ids = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, prompt_width), dtype=torch.long)
    responses = torch.full((rows, width), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width), dtype=torch.float32)
    log_probs = torch.zeros((rows, width), dtype=torch.float32)
    turn_rewards = torch.zeros((rows, width), dtype=torch.float32)
    for row, episode in enumerate(episodes):
        prompt, length = len(episode.prompt_ids), len(episode.response_ids)
        input_ids[row, prompt_width - prompt :] = torch.tensor(episode.prompt_ids)
        attention_mask[row, prompt_width - prompt :] = 1
        responses[row, :length] = torch.tensor(episode.response_ids, dtype=torch.long)
        response_mask[row, :length] = 1
        loss_mask[row, :length] = torch.tensor(episode.policy_mask, dtype=torch.float32)
        log_probs[row, :length] = torch.tensor(episode.log_probs, dtype=torch.float32)
        for end, reward in zip(episode.turn_ends, episode.turn_rewards, strict=True):
            if end > 0:
                turn_rewards[row, end - 1] += reward
    return Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "responses": responses,
            "response_mask": response_mask,
            "response_lengths": response_mask.sum(dim=1),
            "rollout_log_probs": log_probs,
            "loss_mask": loss_mask,
            "sampled_mask": loss_mask.long(),
            "turn_rewards": turn_rewards,
            "scores": torch.tensor([e.reward for e in episodes], dtype=torch.float32),
            "num_turns": torch.tensor([e.turns for e in episodes], dtype=torch.long),
        },
        {"episode_finish": np.array([e.finish for e in episodes], dtype=object)},
    )
