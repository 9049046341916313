"""Dynamic micro-batching under a token budget."""

from __future__ import annotations

import pytest
import torch

from hybridflow.parallel import plan_micro_batches

# Length-skewed like RL rollouts: many short answers, a few long ones.
COUNTS = [12, 700, 9, 30, 15, 512, 8, 64, 20, 11, 900, 40, 7, 25, 16, 33]


@pytest.mark.parametrize("budget", [900, 1024, 1500, 4096])
def test_every_micro_batch_under_budget_and_rows_partitioned(budget):
    plan = plan_micro_batches(COUNTS, budget)
    loads = [sum(COUNTS[r] for r in mb) for mb in plan.micro_batches]
    assert max(loads) <= budget
    rows = sorted(r for mb in plan.micro_batches for r in mb)
    assert rows == list(range(len(COUNTS)))
    # As few micro-batches as the total allows, unless single long rows force more.
    assert len(plan.micro_batches) >= -(-sum(COUNTS) // budget)


def test_balanced_not_just_first_fit():
    # First-fit decreasing would fill the first micro-batch to the budget (8+7+5 = 20) and leave 16
    # in the second; the balanced partition gives 18 and 18.
    counts = [8, 7, 6, 5, 4, 3, 2, 1]
    plan = plan_micro_batches(counts, 20)
    assert sorted(sum(counts[r] for r in mb) for mb in plan.micro_batches) == [18, 18]


def test_restore_order_inverts_the_permutation():
    plan = plan_micro_batches(COUNTS, 1024)
    values = torch.arange(len(COUNTS)) * 10
    outputs = [values[mb] for mb in plan.micro_batches]
    assert torch.equal(plan.restore_order(outputs), values)
    assert plan.restore.tolist() != list(range(len(COUNTS)))  # the plan did reorder rows


def test_min_micro_batches_and_errors():
    assert len(plan_micro_batches([1, 1, 1, 1], 100, min_micro_batches=3).micro_batches) == 3
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
        plan_micro_batches([5, 50], 20)
    with pytest.raises(ValueError, match="exceeds"):
        plan_micro_batches([1, 2], 10, min_micro_batches=3)
