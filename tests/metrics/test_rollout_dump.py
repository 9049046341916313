"""`RolloutDump`: one file per step with each trained row's prompt index and length; rewind on resume."""

from __future__ import annotations

import json

import numpy as np
import torch

from hybridflow.metrics.rollout_dump import RolloutDump, read_rollout_dump
from hybridflow.protocol import Batch


def rollouts(indices: list[int], lengths: list[int], versions: list[int] | None = None) -> Batch:
    mask = torch.zeros(len(indices), 4, dtype=torch.int64)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    tensors = {"response_mask": mask}
    if versions is not None:
        tensors["policy_version"] = torch.tensor(versions)
    return Batch(tensors, {"index": np.array(indices, dtype=object), "response_text": ["ab", "c", ""][: len(indices)]})


def test_each_row_is_a_line_with_its_prompt_index_length_and_version(tmp_path):
    path = RolloutDump(tmp_path).write(3, rollouts([5, 5, 9], [2, 1, 0], versions=[1, 1, 1]))
    assert path == tmp_path / "step_3.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"index": 5, "response_length": 2, "policy_version": 1, "response_text": "ab"},
        {"index": 5, "response_length": 1, "policy_version": 1, "response_text": "c"},
        {"index": 9, "response_length": 0, "policy_version": 1, "response_text": ""},
    ]


def test_partial_rows_carry_the_range_of_their_token_versions(tmp_path):
    # Row 0 was paused after 2 tokens of version 3 and finished on version 4; row 1 is all version 4;
    # row 2 has no response token. Versions past a row's mask (padding) must not count.
    batch = rollouts([5, 5, 9], [3, 1, 0]) | Batch({"token_versions": torch.tensor([[3, 3, 4, 9], [4, 0, 0, 0], [0, 0, 0, 0]])})
    path = RolloutDump(tmp_path).write(1, batch)
    assert [json.loads(line)["token_versions"] for line in path.read_text().splitlines()] == [[3, 4], [4, 4], []]


def test_rewind_removes_the_steps_a_resumed_run_trains_again(tmp_path):
    dump = RolloutDump(tmp_path)
    for step in (1, 2, 3):
        dump.write(step, rollouts([step], [1]))
    (tmp_path / ".step_4.jsonl.tmp").write_text("cut short")  # a crash in the middle of a write
    (tmp_path / "notes.txt").write_text("kept")
    dump.rewind(2)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt", "step_1.jsonl"]
    dump.write(2, rollouts([7, 8], [3, 4]))
    assert read_rollout_dump(tmp_path) == {
        1: [{"index": 1, "response_length": 1, "response_text": "ab"}],
        2: [{"index": 7, "response_length": 3, "response_text": "ab"}, {"index": 8, "response_length": 4, "response_text": "c"}],
    }
