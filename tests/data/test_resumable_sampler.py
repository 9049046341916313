"""ResumableBatchSampler and PromptLoader: the same (seed, epoch, position) gives the same batches."""

import itertools

import pytest

from hybridflow.data import PromptLoader, ResumableBatchSampler


def run_epochs(sampler, epochs):
    return [batch for _ in range(epochs) for batch in sampler]


def test_resuming_mid_epoch_yields_exactly_the_remaining_batches():
    reference = run_epochs(ResumableBatchSampler(23, 4, seed=7), epochs=3)
    assert len(reference) == 3 * 5  # drop_last: 23 rows make 5 batches of 4

    interrupted = ResumableBatchSampler(23, 4, seed=7)
    seen = [next(iter(interrupted))]
    # A new iterator continues the epoch where the abandoned one stopped.
    seen += list(itertools.islice(iter(interrupted), 2))
    state = interrupted.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3)

    resumed = ResumableBatchSampler(23, 4, seed=7)
    resumed.load_state_dict(state)
    rest = list(resumed) + run_epochs(resumed, epochs=2)
    assert seen + rest == reference


def test_epochs_are_permutations_that_differ_and_depend_on_the_seed():
    sampler = ResumableBatchSampler(12, 3, seed=1)
    first, second = list(sampler), list(sampler)
    assert sorted(itertools.chain(*first)) == list(range(12))
    assert sorted(itertools.chain(*second)) == list(range(12))
    assert first != second
    assert list(ResumableBatchSampler(12, 3, seed=2)) != first
    assert list(ResumableBatchSampler(12, 3, seed=1)) == first


def test_drop_last_and_unshuffled_order():
    keep = ResumableBatchSampler(7, 3, shuffle=False, drop_last=False)
    assert len(keep) == 3
    assert list(keep) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(ResumableBatchSampler(7, 3, shuffle=False, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]


def test_state_from_another_sampler_is_refused():
    state = ResumableBatchSampler(23, 4, seed=7).state_dict()
    with pytest.raises(ValueError, match="batch_size"):
        ResumableBatchSampler(23, 5, seed=7).load_state_dict(state)
    with pytest.raises(ValueError, match=r"lacks \['position'\]"):
        ResumableBatchSampler(23, 4, seed=7).load_state_dict(
            {k: v for k, v in state.items() if k != "position"}
        )


def test_loader_resumes_with_the_same_prompt_batches():
    items = [
        {
            "input_ids": [1] * (1 + i % 4),
            "raw_prompt": f"p{i}",
            "ground_truth": str(i),
            "data_source": "s",
            "extra_info": {},
            "index": i,
        }
        for i in range(10)
    ]
    loader = PromptLoader(items, batch_size=3, pad_token_id=0, seed=3)
    full = [list(batch["uid"]) for batch in loader]
    assert len(full) == 3

    partial = PromptLoader(items, batch_size=3, pad_token_id=0, seed=3)
    first = next(iter(partial))
    resumed = PromptLoader(items, batch_size=3, pad_token_id=0, seed=3)
    resumed.load_state_dict(partial.state_dict())
    assert [list(first["uid"])] + [list(batch["uid"]) for batch in resumed] == full
