"""`Batch` operations against hand-built expectations."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from hybridflow.protocol import Batch, BatchConflictError


def make_batch() -> Batch:
    return Batch(
        {
            "ids": torch.tensor([[1, 2], [3, 4], [5, 6]]),
            "score": torch.tensor([0.5, 1.5, 2.5]),
        },
        {"prompt": ["a", "b", "c"], "uid": np.array([10, 11, 12], dtype=object)},
        {"temperature": 1.0},
    )


def test_columns_and_rows():
    batch = make_batch()
    assert len(batch) == 3
    assert batch.keys() == ["ids", "score", "prompt", "uid"]
    assert batch["prompt"].tolist() == ["a", "b", "c"]
    row = batch[1]
    assert row["ids"].tolist() == [[3, 4]] and row["prompt"].tolist() == ["b"]
    assert batch[-1]["prompt"].tolist() == ["c"]
    assert batch[::2]["uid"].tolist() == [10, 12]
    with pytest.raises(KeyError, match="no column 'missing'"):
        batch["missing"]


def test_constructor_rejects_mismatched_rows():
    with pytest.raises(ValueError, match="non-tensor column 'prompt' has 2 rows"):
        Batch({"x": torch.zeros(3)}, {"prompt": ["a", "b"]})
    with pytest.raises(ValueError, match="share their first dimension"):
        Batch({"x": torch.zeros(3), "y": torch.zeros(2)})


def test_select_and_pop():
    batch = make_batch()
    selected = batch.select("ids", "prompt")
    assert selected.keys() == ["ids", "prompt"]
    assert selected["ids"] is batch["ids"] or torch.equal(selected["ids"], batch["ids"])
    popped = batch.pop("score", "uid")
    assert popped.keys() == ["score", "uid"]
    assert batch.keys() == ["ids", "prompt"]
    assert popped["score"].tolist() == [0.5, 1.5, 2.5]
    with pytest.raises(KeyError, match=r"missing columns \['nope'\]"):
        batch.select("nope")


def test_union_adds_columns_and_accepts_equal_overlap():
    batch = make_batch()
    extra = Batch({"reward": torch.tensor([1.0, 0.0, 1.0]), "score": torch.tensor([0.5, 1.5, 2.5])})
    joined = batch | extra
    assert joined.keys() == ["ids", "score", "reward", "prompt", "uid"]
    assert joined["reward"].tolist() == [1.0, 0.0, 1.0]
    assert batch.keys() == ["ids", "score", "prompt", "uid"], "union must not change its inputs"


def test_union_conflict_names_the_columns():
    batch = make_batch()
    other = Batch({"score": torch.tensor([9.0, 9.0, 9.0])}, {"prompt": ["a", "x", "c"]}, {"temperature": 0.7})
    with pytest.raises(BatchConflictError) as caught:
        batch | other
    message = str(caught.value)
    assert "'meta.temperature'" in message and "'prompt'" in message and "'score'" in message
    with pytest.raises(ValueError, match="3 and 2 rows"):
        batch | Batch({"z": torch.zeros(2)})


def test_repeat_is_interleaved_and_keeps_non_tensor_rows():
    repeated = make_batch().repeat(2)
    assert repeated["ids"].tolist() == [[1, 2], [1, 2], [3, 4], [3, 4], [5, 6], [5, 6]]
    assert repeated["prompt"].tolist() == ["a", "a", "b", "b", "c", "c"]
    assert repeated["uid"].tolist() == [10, 10, 11, 11, 12, 12]


def test_uneven_split_with_padding_round_trips_exactly():
    batch = Batch({"x": torch.arange(7)}, {"tag": [f"t{i}" for i in range(7)]})
    padded, pad = batch.pad_to_multiple(3)
    assert pad == 2
    assert padded["x"].tolist() == [0, 1, 2, 3, 4, 5, 6, 0, 1]
    chunks = padded.split(3)
    assert [c["x"].tolist() for c in chunks] == [[0, 1, 2], [3, 4, 5], [6, 0, 1]]
    assert [c["tag"].tolist() for c in chunks] == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6", "t0", "t1"]]
    restored = Batch.concat(chunks).unpad(pad)
    assert restored.equals(batch)
    with pytest.raises(ValueError, match="pad_to_multiple"):
        batch.split(3)
    assert batch.pad_to_multiple(7) == (batch, 0)


def test_reorder_moves_non_tensor_columns_with_their_rows():
    batch = make_batch()
    reordered = batch.reorder([2, 0, 1])
    assert reordered["ids"].tolist() == [[5, 6], [1, 2], [3, 4]]
    assert reordered["prompt"].tolist() == ["c", "a", "b"]
    assert reordered["uid"].tolist() == [12, 10, 11]
    assert batch[torch.tensor([1, 1])]["prompt"].tolist() == ["b", "b"]
    with pytest.raises(IndexError):
        batch.reorder([3])


def test_concat_and_chunk():
    batch = make_batch()
    doubled = Batch.concat([batch, batch[:1]])
    assert doubled["prompt"].tolist() == ["a", "b", "c", "a"]
    assert [len(c) for c in doubled.chunk(3)] == [3, 1]
    with pytest.raises(ValueError, match="batch 1 has columns"):
        Batch.concat([batch, batch.select("ids")])


def test_minibatches_cover_every_row_once():
    batch = Batch({"x": torch.arange(10)}, {"s": [str(i) for i in range(10)]})
    plain = [mb["x"].tolist() for mb in batch.iter_minibatches(4)]
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    generator = torch.Generator().manual_seed(0)
    shuffled = list(batch.iter_minibatches(4, shuffle=True, generator=generator, drop_last=True))
    assert [len(mb) for mb in shuffled] == [4, 4]
    seen = [v for mb in shuffled for v in mb["x"].tolist()]
    assert len(set(seen)) == 8
    for mb in shuffled:  # strings follow their rows through the shuffle
        assert mb["s"].tolist() == [str(v) for v in mb["x"].tolist()]
    expected_order = torch.randperm(10, generator=torch.Generator().manual_seed(0))[:8].tolist()
    assert seen == expected_order


def test_pickle_round_trip_keeps_dtypes_including_bfloat16():
    batch = Batch(
        {"h": torch.randn(4, 3).to(torch.bfloat16), "mask": torch.tensor([True, False, True, True])},
        {"s": ["w", "x", "y", "z"]},
        {"step": 3},
    )
    restored = pickle.loads(pickle.dumps(batch, protocol=5))
    assert restored.equals(batch)
    assert restored["h"].dtype == torch.bfloat16
    restored["h"][0, 0] = 1.0  # received tensors are writable


def test_pickle_protocol_5_ships_tensor_bytes_out_of_band():
    batch = Batch({"x": torch.zeros(1000, 1000)})
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
    assert len(payload) < 10_000
    assert sum(memoryview(b).nbytes for b in buffers) == 4 * 1000 * 1000
