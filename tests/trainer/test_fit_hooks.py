"""`fit`'s stop rule and evaluation schedule on their own: which progress reaches or passes what (no Ray)."""

from __future__ import annotations

import pytest

from trainer.fit import Every, Progress, StopAt


def test_stop_at_is_reached_by_any_amount_it_sets():
    stop = StopAt(steps=10, generated_tokens=1000)
    assert not stop.reached(Progress(steps=9, seconds=1e6, generated_tokens=999))  # seconds are not set
    assert stop.reached(Progress(steps=10, generated_tokens=0))
    assert stop.reached(Progress(steps=1, generated_tokens=1000))
    assert StopAt(seconds=2.5).reached(Progress(steps=1, seconds=2.5))
    assert not StopAt().reached(Progress(steps=10**6, seconds=1e9, generated_tokens=1e9))


def test_every_passes_once_per_multiple_crossed():
    every = Every(generated_tokens=100)
    assert not every.passed(Progress(generated_tokens=0), Progress(generated_tokens=99))
    assert every.passed(Progress(generated_tokens=99), Progress(generated_tokens=100))
    assert not every.passed(Progress(generated_tokens=100), Progress(generated_tokens=199))
    assert every.passed(Progress(generated_tokens=150), Progress(generated_tokens=420))  # 2, 3 and 4: once
    steps = Every(steps=3)
    due = [s for s in range(1, 10) if steps.passed(Progress(steps=s - 1), Progress(steps=s))]
    assert due == [3, 6, 9]


@pytest.mark.parametrize("kind", [StopAt, Every])
def test_amounts_must_be_positive(kind):
    with pytest.raises(ValueError, match=rf"{kind.__name__}\.seconds must be > 0"):
        kind(seconds=0)
    with pytest.raises(ValueError, match=rf"{kind.__name__}\.steps must be > 0"):
        kind(steps=-1)
