"""Loss aggregation modes, and micro-batches summing to the full batch with global normalisers."""

import math

import pytest
import torch
from torch.testing import assert_close

from hybridflow.algos import aggregate_loss

# Row 0 has 2 valid tokens, row 1 one, row 2 is a padding row (no valid token). Masked positions
# hold nan/inf, which must not leak into any result.
LOSS = torch.tensor([[1.0, 2.0, math.nan], [4.0, math.inf, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("token-mean", {}, (1 + 2 + 4) / 3),
        ("token-mean", {"global_token_count": 10}, (1 + 2 + 4) / 10),
        ("seq-mean-token-mean", {}, ((1 + 2) / 2 + 4 / 1) / 2),  # padding row not counted
        ("seq-mean-token-mean", {"global_seq_count": 5}, ((1 + 2) / 2 + 4 / 1) / 5),
        ("seq-mean-token-sum", {}, ((1 + 2) + 4) / 2),
        ("seq-mean-token-sum-norm", {"norm_constant": 4}, ((1 + 2) / 4 + 4 / 4) / 2),
        ("seq-mean-token-sum-norm", {}, ((1 + 2) / 3 + 4 / 3) / 2),  # falls back to width 3
        ("seq-mean-token-sum-norm", {"norm_constant": 4, "global_seq_count": 8}, ((1 + 2) / 4 + 4 / 4) / 8),
    ],
)
def test_modes_by_hand(mode, kwargs, expected):
    assert_close(aggregate_loss(LOSS, MASK, mode, **kwargs), torch.tensor(expected))


def test_empty_mask_gives_zero_not_nan():
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert_close(aggregate_loss(LOSS, torch.zeros(3, 3), mode), torch.tensor(0.0))


def test_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        aggregate_loss(LOSS, MASK[:, :2])


# A batch of 5 sequences with different lengths, cut into micro-batches of 2, 1 and 2 rows; each
# micro-batch is trimmed to its own padded width, as a dynamic-batching dataloader would do.
FULL_MASK = torch.tensor(
    [
        [1, 1, 1, 1, 0],
        [1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
    ]
)
FULL_LOSS = torch.arange(25, dtype=torch.float32).reshape(5, 5) / 7 - 1.0
SLICES = [(slice(0, 2), 4), (slice(2, 3), 5), (slice(3, 5), 3)]


def micro_batches():
    for rows, width in SLICES:
        yield FULL_LOSS[rows, :width], FULL_MASK[rows, :width]


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_batches_sum_to_full_batch_with_global_normalisers(mode):
    global_kwargs = {
        "global_token_count": int(FULL_MASK.sum()),  # 15
        "global_seq_count": 5,
        "norm_constant": 5.0,
    }
    full = aggregate_loss(FULL_LOSS, FULL_MASK, mode, **global_kwargs)
    parts = [aggregate_loss(loss, mask, mode, **global_kwargs) for loss, mask in micro_batches()]
    assert_close(sum(parts), full)


def test_token_mean_micro_batches_by_hand_and_gradients():
    # Full token-mean = (sum of valid entries) / 15; the local-count version is a mean of means.
    valid_sum = float((FULL_LOSS * FULL_MASK).sum())
    full = aggregate_loss(FULL_LOSS, FULL_MASK, "token-mean")
    assert_close(full, torch.tensor(valid_sum / 15))

    leaves = [loss.clone().requires_grad_(True) for loss, _ in micro_batches()]
    total = sum(
        aggregate_loss(leaf, mask, "token-mean", global_token_count=15)
        for leaf, (_, mask) in zip(leaves, micro_batches(), strict=True)
    )
    assert_close(total, full)
    total.backward()
    # Every valid token gets the same gradient 1/15, whichever micro-batch it landed in.
    for leaf, (_, mask) in zip(leaves, micro_batches(), strict=True):
        assert_close(leaf.grad, mask.float() / 15)

    # Without the global count the micro-batch results do NOT add up to the full-batch value.
    local = sum(aggregate_loss(loss, mask, "token-mean") for loss, mask in micro_batches())
    assert not torch.allclose(local, full)


def test_data_parallel_ranks_sum_with_global_normaliser():
    # Two ranks, each with two micro-batches; the per-rank sums add to the full-batch value.
    rank_rows = [[slice(0, 1), slice(1, 2)], [slice(2, 4), slice(4, 5)]]
    n = int(FULL_MASK.sum())
    full = aggregate_loss(FULL_LOSS, FULL_MASK, "seq-mean-token-mean", global_seq_count=5)
    per_rank = [
        sum(
            aggregate_loss(
                FULL_LOSS[rows],
                FULL_MASK[rows],
                "seq-mean-token-mean",
                global_token_count=n,
                global_seq_count=5,
            )
            for rows in rows_of_rank
        )
        for rows_of_rank in rank_rows
    ]
    assert_close(per_rank[0] + per_rank[1], full)
