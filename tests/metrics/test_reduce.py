"""Reducing metrics by kind, and tensor summary statistics under a mask."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.metrics import metric_kind, reduce_metrics, tensor_stats


def test_kinds_follow_names_and_explicit_declarations():
    assert metric_kind("actor/pg_loss") == "mean"
    assert metric_kind("response_length/max") == "max"
    assert metric_kind("sync/log_prob_abs_diff_max") == "max"
    assert metric_kind("score/min") == "min"
    assert metric_kind("group/count") == "sum"
    assert metric_kind("timing_s/update") == "max"
    assert metric_kind("actor/tokens", {"actor/tokens": "sum"}) == "sum"
    assert metric_kind("actor/grad_norm", {"actor/*": "max"}) == "max"


def test_reduce_per_rank_dicts_by_kind():
    per_rank = [
        {
            "actor/pg_loss": 1.0,
            "score/max": 0.5,
            "score/min": 0.0,
            "tokens/count": 10,
            "timing_s/update": 3.0,
        },
        {
            "actor/pg_loss": 3.0,
            "score/max": 0.9,
            "score/min": -0.2,
            "tokens/count": 30,
            "timing_s/update": 4.0,
        },
    ]
    assert reduce_metrics(per_rank) == {
        "actor/pg_loss": 2.0,
        "score/max": 0.9,
        "score/min": -0.2,
        "tokens/count": 40.0,
        "timing_s/update": 4.0,
    }


def test_reduce_flattens_micro_batch_lists_and_tensors():
    metrics = [
        {"actor/pg_clipfrac": [torch.tensor(0.1), torch.tensor(0.3)]},
        {"actor/pg_clipfrac": torch.tensor([0.2]), "actor/only_here": 5},
    ]
    reduced = reduce_metrics(metrics)
    assert reduced["actor/pg_clipfrac"] == pytest.approx(0.2)
    assert reduced["actor/only_here"] == 5.0


def test_reduce_names_a_non_numeric_metric():
    with pytest.raises(TypeError, match="metric 'note' holds str"):
        reduce_metrics([{"note": "hello"}])


def test_tensor_stats_under_a_mask():
    values = torch.tensor([[1.0, 2.0, 99.0], [3.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    stats = tensor_stats("x", values, mask)
    assert stats["x/mean"] == 2.0
    assert stats["x/std"] == pytest.approx(math.sqrt(2 / 3))  # population std of 1, 2, 3
    assert (stats["x/min"], stats["x/max"]) == (1.0, 3.0)


def test_tensor_stats_of_nothing_is_empty():
    assert tensor_stats("x", torch.ones(2, 2), torch.zeros(2, 2)) == {}
    assert tensor_stats("x", torch.tensor([4.0])) == {"x/mean": 4.0, "x/std": 0.0, "x/min": 4.0, "x/max": 4.0}
