"""Shaping functions computed against hand-worked values."""

import pytest
import torch

from hybridflow.protocol import Batch
from hybridflow.rewards import get_reward_shaping, register_reward_shaping
from hybridflow.rewards.shaping import REWARD_SHAPING


def batch_with_lengths(lengths, width=16):
    mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(-1)).long()
    return Batch({"response_mask": mask})


def test_overlong_penalty_follows_dapo():
    fn = get_reward_shaping("overlong_penalty")
    scores = torch.ones(6)
    # L_max=12, L_cache=4: free up to 8 tokens, -1 from 12 on.
    shaped = fn(scores, batch_with_lengths([3, 8, 9, 10, 12, 16]), max_response_length=12, cache_length=4)
    assert shaped.tolist() == [1.0, 1.0, 0.75, 0.5, 0.0, 0.0]
    half = fn(
        torch.ones(2),
        batch_with_lengths([10, 16]),
        max_response_length=12,
        cache_length=4,
        penalty_factor=0.5,
    )
    assert half.tolist() == [0.75, 0.5]
    with pytest.raises(ValueError, match="cache_length"):
        fn(scores, batch_with_lengths([1] * 6), max_response_length=4, cache_length=5)


def test_length_penalty_is_linear_in_length():
    fn = get_reward_shaping("length_penalty")
    shaped = fn(torch.tensor([1.0, 0.0]), batch_with_lengths([4, 8]), coef=0.5, max_response_length=8)
    assert shaped.tolist() == [0.75, -0.5]


def test_shaping_needs_the_response_mask():
    with pytest.raises(KeyError, match="'length_penalty' needs the column 'response_mask'"):
        get_reward_shaping("length_penalty")(
            torch.ones(2), Batch({"scores": torch.ones(2)}), coef=1.0, max_response_length=4
        )


def test_registering_a_new_shaping_and_refusing_a_clash():
    @register_reward_shaping("test_clip_negative")
    def clip_negative(scores, batch):
        return scores.clamp(min=0.0)

    try:
        assert get_reward_shaping("test_clip_negative")(torch.tensor([-2.0, 3.0]), None).tolist() == [
            0.0,
            3.0,
        ]
        with pytest.raises(ValueError, match="already registered as 'test_clip_negative'"):
            register_reward_shaping("test_clip_negative")(lambda scores, batch: scores)
    finally:
        del REWARD_SHAPING["test_clip_negative"]
