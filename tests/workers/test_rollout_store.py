"""`RolloutStore`: rows by id, prompt widths joined, unknown ids named, earlier steps dropped."""

from __future__ import annotations

import pytest
import torch

from hybridflow.contract import MissingColumnError, require_columns
from hybridflow.protocol import Batch
from workers.rollout_store import HELD_COLUMNS, RolloutStore

PAD = 99


def rollouts(rows: int, prompt_len: int, first_token: int) -> Batch:
    """``rows`` rows whose prompt holds ``rows - i`` real tokens (left-padded with ``PAD``) and whose
    tokens are distinct across calls (they start at ``first_token``)."""
    real = torch.arange(rows, 0, -1).clamp(max=prompt_len)[:, None]
    mask = (torch.arange(prompt_len) >= prompt_len - real).long()
    ids = torch.where(mask.bool(), first_token + torch.arange(rows * prompt_len).view(rows, prompt_len), PAD)
    responses = first_token + 1000 + torch.arange(rows * 3).view(rows, 3)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "responses": responses,
            "response_mask": torch.ones(rows, 3).long(),
        }
    )


def test_rows_come_back_in_the_order_asked_for():
    store = RolloutStore(PAD)
    batch = rollouts(4, 3, first_token=0)
    store.put(7, torch.arange(10, 14), batch)
    got = store.rows(torch.tensor([13, 10, 12, 10]))
    assert got.equals(batch.reorder([3, 0, 2, 0]))
    assert store.next_id(7) == 14 and store.next_id(8) == 0


def test_rows_of_calls_with_different_prompt_widths_are_left_padded_to_the_widest_asked_for():
    store = RolloutStore(PAD)
    narrow, wide, widest = rollouts(2, 2, first_token=0), rollouts(2, 4, first_token=100), rollouts(1, 6, 200)
    store.put(1, torch.tensor([0, 1]), narrow)
    store.put(1, torch.tensor([2, 3]), wide)
    store.put(1, torch.tensor([4]), widest)
    got = store.rows(torch.tensor([3, 0, 1]))
    # Padded to the wide call's 4 columns, not the widest call's 6: no row of that call was asked for.
    assert got["input_ids"].tolist() == [[PAD, PAD, PAD, 107], [PAD, PAD, 0, 1], [PAD, PAD, PAD, 3]]
    assert got["attention_mask"].tolist() == [[0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 1]]
    assert got["responses"].tolist() == [[1103, 1104, 1105], [1000, 1001, 1002], [1003, 1004, 1005]]


def test_unknown_ids_are_named():
    store = RolloutStore(PAD)
    store.put(1, torch.arange(4), rollouts(4, 3, first_token=0))
    with pytest.raises(KeyError, match=r"no rollout rows held for ids \[4, 9\] \(holding 4 rows of step 1\)"):
        store.rows(torch.tensor([0, 4, 2, 9]))


def test_a_later_step_drops_the_rows_of_the_earlier_one():
    store = RolloutStore(PAD)
    store.put(1, torch.arange(4), rollouts(4, 3, first_token=0))
    later = rollouts(2, 3, first_token=500)
    store.put(2, torch.arange(2), later)
    assert len(store) == 2 and store.step == 2
    assert store.rows(torch.arange(2)).equals(later)  # ids 0 and 1 now name the later step's rows
    assert not store.holds(torch.tensor([3]))
    with pytest.raises(KeyError, match=r"ids \[2, 3\]"):
        store.rows(torch.tensor([2, 3]))


def test_an_id_is_held_once_per_step():
    store = RolloutStore(PAD)
    store.put(1, torch.arange(4), rollouts(4, 3, first_token=0))
    with pytest.raises(ValueError, match=r"already held: \[3\]"):
        store.put(1, torch.tensor([3, 4]), rollouts(2, 3, first_token=100))


def test_rollout_ids_stand_in_for_the_held_columns_of_a_method_that_declares_them():
    ids_only = Batch({"rollout_ids": torch.arange(2), "advantages": torch.zeros(2, 3)})
    require_columns(ids_only, (*HELD_COLUMNS, "advantages"), "actor.update_actor", held=HELD_COLUMNS)
    with pytest.raises(
        MissingColumnError, match=r"update_actor needs column 'advantages'; the batch has: rollout_ids"
    ):
        require_columns(
            ids_only.select("rollout_ids"), (*HELD_COLUMNS, "advantages"), "update_actor", held=HELD_COLUMNS
        )
    # Without ids, the message names every missing column and what could stand in for the held ones.
    with pytest.raises(
        MissingColumnError,
        match=r"needs columns 'input_ids', 'attention_mask', 'responses', 'response_mask' "
        r"\(or 'rollout_ids' of rollouts the workers hold\); the batch has: advantages",
    ):
        require_columns(
            ids_only.select("advantages"), (*HELD_COLUMNS, "advantages"), "update_actor", held=HELD_COLUMNS
        )
    # A method that declares no held columns still needs them all.
    with pytest.raises(MissingColumnError, match=r"critic\.compute_values needs columns 'input_ids'"):
        require_columns(ids_only, HELD_COLUMNS, "critic.compute_values")
