"""Controller-side steps of the RL loop: pure functions of a Batch (no weights, no workers)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.algos import apply_kl_penalty, compute_advantage, compute_kl, masked_mean
from hybridflow.protocol import Batch
from trainer.config import AlgorithmConfig

__all__ = ["add_group_ids", "compute_advantages", "decode_responses", "kl_in_reward"]


def decode_responses(rollouts: Batch, tokenizer: PreTrainedTokenizerBase) -> Batch:
    """``response_text``: each row's generated tokens as text (special tokens dropped)."""
    rows = [ids[mask.bool()].tolist() for ids, mask in zip(rollouts["responses"], rollouts["response_mask"], strict=True)]
    return Batch(non_tensors={"response_text": tokenizer.batch_decode(rows, skip_special_tokens=True)})


def add_group_ids(rollouts: Batch, samples_per_prompt: int) -> Batch:
    """``group_ids [batch]``: the prompt each row answers (rows come interleaved, n per prompt)."""
    if len(rollouts) % samples_per_prompt:
        raise ValueError(f"{len(rollouts)} rollout rows do not split into groups of {samples_per_prompt}")
    return Batch({"group_ids": torch.arange(len(rollouts)) // samples_per_prompt})


def kl_in_reward(rollouts: Batch, estimator: str, coef: float) -> tuple[Batch, float]:
    """Token rewards with a KL-to-reference penalty: ``r_t - coef * kl_t`` (Ziegler et al. 2019).

    Returns the ``token_level_rewards`` column and the mean per-token KL (nats), which drives an
    adaptive coefficient.
    """
    mask = rollouts["response_mask"]
    kl = compute_kl(rollouts["old_log_probs"], rollouts["ref_log_probs"], estimator) * mask
    rewards = apply_kl_penalty(rollouts["token_level_scores"], kl, coef, mask)
    return Batch({"token_level_rewards": rewards}), masked_mean(kl, mask).item()


def compute_advantages(rollouts: Batch, algorithm: AlgorithmConfig) -> Batch:
    """``advantages`` and ``returns [batch, response_len]`` from the configured estimator.

    Reads ``token_level_rewards`` (falling back to ``token_level_scores``), ``response_mask``,
    ``group_ids`` and, for GAE, ``values``.
    """
    data = {key: rollouts[key] for key in ("response_mask", "group_ids", "values") if key in rollouts}
    data["token_level_rewards"] = (
        rollouts["token_level_rewards"] if "token_level_rewards" in rollouts else rollouts["token_level_scores"]
    )
    advantages, returns = compute_advantage(data, algorithm.adv_estimator, **algorithm.advantage_params())
    return Batch({"advantages": advantages, "returns": returns})
