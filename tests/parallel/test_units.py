"""Pieces that need no process group: dp/tp coordinates, HF names, bucketing."""

from __future__ import annotations

import pytest
import torch

from hybridflow.parallel import data_parallel_size, dp_rank_info, hf_param_name, iter_buckets


def test_dp_rank_info_groups_consecutive_ranks_into_tp_groups():
    infos = [dp_rank_info(rank, 8, 4) for rank in range(8)]
    assert [(i.dp_rank, i.tp_rank) for i in infos] == [(r // 4, r % 4) for r in range(8)]
    assert [i.is_collector for i in infos] == [True, False, False, False] * 2
    assert {i.dp_size for i in infos} == {2}


def test_tp_must_divide_world():
    assert data_parallel_size(6, 3) == 2
    with pytest.raises(ValueError, match=r"tp_size=4 does not divide world_size=6.*\[1, 2, 3, 6\]"):
        data_parallel_size(6, 4)
    with pytest.raises(ValueError, match="rank 8"):
        dp_rank_info(8, 8, 2)


def test_hf_param_name_strips_wrapper_segments():
    assert hf_param_name("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert hf_param_name("_orig_mod.lm_head.weight") == "lm_head.weight"


def test_buckets_respect_limit_and_keep_order():
    sizes = [10, 30, 5, 60, 1, 200, 8, 8, 8]  # float32 elements; 200 * 4 bytes exceeds the limit
    named = [(f"t{i}", torch.zeros(n)) for i, n in enumerate(sizes)]
    buckets = list(iter_buckets(named, bucket_bytes=256))
    assert [name for bucket in buckets for name, _ in bucket] == [name for name, _ in named]
    for bucket in buckets:
        total = sum(t.numel() * 4 for _, t in bucket)
        assert total <= 256 or len(bucket) == 1
    assert [len(b) for b in buckets] == [3, 2, 1, 3]
