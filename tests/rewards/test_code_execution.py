"""The code-execution rewards on a correct, a wrong, a hanging and a crashing solution, with hand-expected scores."""

from __future__ import annotations

import json

import pytest

from hybridflow.protocol import Batch
from hybridflow.rewards import RewardConfig, RewardManager, get_reward_function
from hybridflow.rewards.code_execution import CASE_LIMITS, _sandbox, run_cases

# Read two integers, print their sum.
IO_CASES = [
    {"stdin": "1 2\n", "stdout": "3\n"},
    {"stdin": "10 -4\n", "stdout": "6"},
    {"stdin": "0 0\n", "stdout": "0\n\n"},
]
CORRECT = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
# Subtracts a positive second number: passes cases 2 and 3 of 3.
WRONG = "a, b = map(int, input().split())\nprint(a + b if b <= 0 else a - b)\n"
HANGING = "while True:\n    pass\n"
# math.isqrt of a negative number raises: crashes on cases 2 and 3, passes case 1 only.
CRASHING = "import math\na, b = map(int, input().split())\nprint(a + b + 0 * math.isqrt(b - 1))\n"

ASSERT_CASES = {
    "tests": [
        {"assert": "assert add(2, 3) == 5"},
        {"assert": "assert add(-1, 1) == 0"},
        {"assert": "assert add(10, 5) == 15"},
        {"assert": "assert add('a', 'b') == 'ab'"},
    ]
}


@pytest.mark.parametrize(
    ("solution", "fraction", "all_or_nothing"),
    [(CORRECT, 1.0, 1.0), (WRONG, 2 / 3, 0.0), (HANGING, 0.0, 0.0), (CRASHING, 1 / 3, 0.0)],
)
def test_stdin_cases_score(solution, fraction, all_or_nothing):
    score = get_reward_function("code_execution")("code", solution, IO_CASES)
    assert score == pytest.approx(fraction)
    assert get_reward_function("code_execution_all")("code", solution, json.dumps(IO_CASES)) == all_or_nothing


def test_assert_cases_score():
    code_execution = get_reward_function("code_execution")
    assert code_execution("code", "def add(a, b):\n    return a + b\n", ASSERT_CASES) == 1.0
    # Integer-only addition fails the string case: 3 of 4.
    assert code_execution("code", "def add(a, b):\n    return int(a) + int(b)\n", ASSERT_CASES) == 0.75


def test_timeouts_and_limits_are_counted():
    hanging = run_cases(HANGING, IO_CASES, _sandbox(), CASE_LIMITS)
    assert (hanging.passed, hanging.failed) == (0, 3)
    # The loop ends by the CPU limit or, on a loaded machine, by the wall limit: every case counts as one or the other.
    assert hanging.timeouts + hanging.limits_hit == 3
    crashing = run_cases(CRASHING, IO_CASES, _sandbox(), CASE_LIMITS)
    assert (crashing.passed, crashing.failed, crashing.timeouts, crashing.limits_hit) == (1, 2, 0, 0)


def test_bad_ground_truth_names_the_case():
    with pytest.raises(ValueError, match="test case 1"):
        get_reward_function("code_execution")("code", CORRECT, [{"stdin": "", "stdout": ""}, {"input": "1"}])


def test_through_the_reward_manager():
    """The registered name works in the manager's worker processes, each building its sandbox at start."""
    solutions = [CORRECT, WRONG, CRASHING]
    batch = Batch(
        {},
        {
            "response_text": solutions,
            "ground_truth": [IO_CASES] * len(solutions),
            "data_source": ["code"] * len(solutions),
        },
    )
    config = RewardConfig(num_workers=1, timeout_s=30.0, default_fn="code_execution", abort_failure_rate=None)
    with RewardManager(config) as manager:
        scores = manager(batch)["scores"].tolist()
    assert scores == pytest.approx([1.0, 2 / 3, 1 / 3])
