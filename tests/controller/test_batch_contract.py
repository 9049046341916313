"""The Batch contract: declared columns are checked on the controller, on real Ray workers."""

from __future__ import annotations

import pytest
import torch

from hybridflow.contract import MissingColumnError, step_columns
from hybridflow.controller import ResourcePool, RoleSpec, create_colocated_worker_groups
from hybridflow.protocol import Batch
from tests.controller.workers_under_test import ColumnWorker, WrappingColumnWorker


@pytest.fixture(scope="module")
def column_groups(ray_cluster):
    pool = ResourcePool([2], cpus_per_slot=0.5, name="columns")
    groups = create_colocated_worker_groups(
        pool, {"plain": RoleSpec(ColumnWorker), "wrapped": RoleSpec(WrappingColumnWorker)}, name="columns"
    )
    yield groups
    groups["plain"].hosts.shutdown()
    pool.release()


def test_a_missing_input_column_fails_on_the_controller_naming_the_method_and_column(column_groups):
    group = column_groups["plain"]
    with pytest.raises(MissingColumnError, match=r"plain\.double_x needs column 'x'; the batch has: w"):
        group.double_x(Batch({"w": torch.arange(4)}))
    # Nothing was sent: the workers never ran the method.
    assert group.call_count() == [0, 0]
    assert torch.equal(group.double_x(Batch({"x": torch.arange(4)}))["y"], torch.arange(4) * 2)
    assert group.call_count() == [1, 1]


def test_a_missing_output_column_names_the_method(column_groups):
    with pytest.raises(MissingColumnError, match=r"plain\.forgets_y returned no column 'y'; the batch has: z"):
        column_groups["plain"].forgets_y(Batch({"x": torch.arange(4)}))


def test_an_undecorated_override_keeps_the_registration_and_the_contract(column_groups):
    group = column_groups["wrapped"]
    out = group.double_x(Batch({"x": torch.arange(4)}))
    assert torch.equal(out["y"], torch.arange(4) * 2)
    assert out["wrapped_by_rank"].tolist() == [0, 0, 1, 1]  # rows 0-1 on rank 0, rows 2-3 on rank 1
    with pytest.raises(MissingColumnError, match=r"wrapped\.double_x needs column 'x'"):
        group.double_x(Batch({"w": torch.arange(4)}))


def test_step_columns_checks_inputs_and_outputs_of_a_controller_step():
    @step_columns(reads=("scores", "group_ids"), writes=("advantages",))
    def centre(rollouts: Batch, forget: bool = False) -> Batch:
        centred = rollouts["scores"] - rollouts["scores"].mean()
        return Batch({"other": centred} if forget else {"advantages": centred})

    assert centre.reads == ("scores", "group_ids") and centre.writes == ("advantages",)
    rows = Batch({"scores": torch.tensor([1.0, 3.0]), "group_ids": torch.tensor([0, 0])})
    assert centre(rows)["advantages"].tolist() == [-1.0, 1.0]
    with pytest.raises(MissingColumnError, match="centre needs columns 'scores', 'group_ids'"):
        centre(Batch({"x": torch.zeros(2)}))
    with pytest.raises(MissingColumnError, match="centre returned no column 'advantages'"):
        centre(rows, forget=True)
