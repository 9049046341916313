"""Prompt unpadding, output packing and the sampling/config validation."""

from __future__ import annotations

import pytest
import torch

from hybridflow.protocol import Batch
from hybridflow.rollout import (
    RolloutConfig,
    SamplingParams,
    build_rollout_engine,
    pack_rollouts,
    prompt_token_lists,
)


def _prompts() -> Batch:
    return Batch(
        {
            "input_ids": torch.tensor([[0, 0, 5, 6], [7, 8, 9, 4]]),
            "attention_mask": torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]]),
        },
        {"uid": ["a", "b"]},
    )


def test_prompt_token_lists_drop_left_padding() -> None:
    assert prompt_token_lists(_prompts()) == [[5, 6], [7, 8, 9, 4]]


def test_pack_interleaves_samples_and_pads_to_max_new_tokens() -> None:
    out = pack_rollouts(
        _prompts(),
        n=2,
        responses=[[1], [2, 3], [4, 5, 6], []],
        log_probs=[[-0.1], [-0.2, -0.3], [-0.4, -0.5, -0.6], []],
        finish_reasons=["stop", "stop", "length", "stop"],
        max_new_tokens=3,
        pad_token_id=9,
    )
    assert out["uid"].tolist() == ["a", "a", "b", "b"]
    assert out["responses"].tolist() == [[1, 9, 9], [2, 3, 9], [4, 5, 6], [9, 9, 9]]
    assert out["response_mask"].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1], [0, 0, 0]]
    assert out["response_lengths"].tolist() == [1, 2, 3, 0]
    torch.testing.assert_close(out["rollout_log_probs"][1], torch.tensor([-0.2, -0.3, 0.0]))
    assert out["input_ids"][2].tolist() == [7, 8, 9, 4]
    assert out["finish_reason"].tolist() == ["stop", "stop", "length", "stop"]


def test_pack_refuses_mismatched_inputs() -> None:
    with pytest.raises(ValueError, match="expected 4 samples"):
        pack_rollouts(_prompts(), 2, [[1]], [[0.0]], ["stop"], 3, 0)
    with pytest.raises(ValueError, match="longer than max_new_tokens"):
        pack_rollouts(_prompts(), 1, [[1, 2, 3, 4], [1]], [[0.0] * 4, [0.0]], ["length", "stop"], 3, 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"n": 0}, "sampling.n"), ({"top_k": 0}, "sampling.top_k"), ({"top_p": 0.0}, "sampling.top_p")],
)
def test_sampling_params_name_the_bad_key(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_config_names_the_bad_key() -> None:
    with pytest.raises(ValueError, match=r"rollout\.engine must be one of"):
        build_rollout_engine(RolloutConfig(engine="sglang"), "no-model-needed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"rollout\.kv_cache_bytes: must be >= 1, got 0"):
        RolloutConfig(kv_cache_bytes=0)
