"""Whatever a reward function returns, generated: None, text, NaN and infinities, ints too large for a
float, bools, numpy and torch values, lists, dicts, Decimals, complex numbers, objects that claim to be
real numbers but whose ``float()`` fails, and exceptions that cannot even be printed.

The invariant: the manager's call returns; a row's score is the value as a float when it is a finite
real number within float32's range (scores are float32), else the fallback score, never NaN or
inf; and every other row is counted in
``reward/bad_type`` (or ``reward/errors`` for a raise), with its status saying which.
"""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridflow.protocol import Batch
from hybridflow.rewards import RewardConfig, RewardManager

FNS = Path(__file__).parents[1] / "rewards" / "reward_fns.py"
FALLBACK = -1.0
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

FLOATS = st.floats(allow_nan=True, allow_infinity=True)
# Python ints past 2**1024 have no float; float() raises OverflowError on them.
INTS = st.integers() | st.sampled_from([2**1023, 2**1024, -(2**1024), 10**400])
NOT_NUMBERS = ["none", "list", "dict", "ndarray", "decimal", "complex", "tensor", "text"]
SPEC = st.one_of(
    st.tuples(st.just("float"), FLOATS),
    st.tuples(st.just("int"), INTS),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("np_float32"), FLOATS),
    st.tuples(st.just("np_int64"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("fraction"), st.tuples(st.integers(-1000, 1000), st.integers(1, 1000))),
    st.tuples(st.sampled_from(NOT_NUMBERS), FLOATS),
    st.tuples(st.just("text"), st.text(max_size=5)),
    st.tuples(st.just("real_bad_float"), st.sampled_from(["raise", math.nan, math.inf, -math.inf, "x"])),
    st.tuples(st.sampled_from(["raise", "raise_unprintable"]), st.text(max_size=5)),
)


def expected(kind: str, parameter) -> tuple[str, float]:
    """The status and score a row must get, worked out from what the function returns."""
    if kind in ("raise", "raise_unprintable"):
        return "error", FALLBACK
    if kind in NOT_NUMBERS or kind == "real_bad_float":
        return "bad_type", FALLBACK
    if kind == "fraction":
        value = float(Fraction(*parameter))
    elif kind == "np_float32":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # overflow to inf is the case under test
            value = float(np.float32(parameter))
    else:
        try:
            value = float({"bool": bool}.get(kind, lambda p: p)(parameter))
        except OverflowError:
            return "bad_type", FALLBACK
    # Scores are float32: a finite float64 past float32's range would be inf there.
    return ("ok", value) if abs(value) <= FLOAT32_MAX else ("bad_type", FALLBACK)


@pytest.fixture(scope="module")
def manager():
    config = RewardConfig(
        num_workers=2,
        timeout_s=10.0,
        fallback_score=FALLBACK,
        default_fn=f"{FNS}:returns_built_value",
        abort_failure_rate=None,  # every call may fail on every row here
    )
    with RewardManager(config) as scorer:
        yield scorer


@FUZZ
@given(specs=st.lists(SPEC, min_size=1, max_size=12))
def test_no_return_value_crashes_the_manager_or_reaches_the_scores(manager, specs):
    rows = len(specs)
    mask = torch.ones(rows, 3, dtype=torch.long)
    batch = Batch(
        {"response_mask": mask},
        {
            "response_text": ["r"] * rows,
            "ground_truth": [json.dumps([kind, parameter]) for kind, parameter in specs],
            "data_source": ["fuzz"] * rows,
        },
    )
    out = manager(batch)

    statuses, scores = zip(*(expected(kind, parameter) for kind, parameter in specs), strict=True)
    assert list(out["reward_status"]) == list(statuses)
    assert out["scores"].tolist() == torch.tensor(scores, dtype=torch.float32).tolist()
    assert torch.isfinite(out["scores"]).all() and torch.isfinite(out["token_level_scores"]).all()
    metrics = out.meta["reward_metrics"]
    assert metrics["reward/bad_type"] == statuses.count("bad_type")
    assert metrics["reward/errors"] == statuses.count("error")
    assert metrics["reward/timeouts"] == 0.0
    assert metrics["reward/worker_restarts"] == 0.0  # no value took a worker down
