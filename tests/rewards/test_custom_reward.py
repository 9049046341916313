"""Loading reward functions from a file named in the config."""

import pytest

from hybridflow.rewards import load_reward_function, resolve_reward_function

SOURCE = """
from dataclasses import dataclass


@dataclass
class Weights:
    right: float = 2.0


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return Weights().right if solution_str.strip() == ground_truth else -0.5


LIMIT = 3
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_function_loaded_from_file_scores(reward_file):
    fn = load_reward_function(reward_file, "compute_score")
    assert fn(data_source="d", solution_str=" 7 ", ground_truth="7") == 2.0
    assert fn(data_source="d", solution_str="8", ground_truth="7") == -0.5
    assert resolve_reward_function(f"{reward_file}:compute_score")("d", "7", "7") == 2.0


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent\.py"):
        load_reward_function(tmp_path / "absent.py", "compute_score")


def test_missing_function_lists_what_the_file_defines(reward_file):
    with pytest.raises(
        AttributeError, match=r"defines no 'score_fn'; it defines \['Weights', 'compute_score', 'dataclass'\]"
    ):
        load_reward_function(reward_file, "score_fn")


def test_non_callable_name_and_broken_file(reward_file, tmp_path):
    with pytest.raises(TypeError, match=r"'LIMIT' .* is a int"):
        load_reward_function(reward_file, "LIMIT")
    broken = tmp_path / "broken.py"
    broken.write_text("def compute_score(:\n")
    with pytest.raises(ImportError, match=r"broken\.py.*failed to load"):
        load_reward_function(broken, "compute_score")
