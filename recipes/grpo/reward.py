"""The R1-Zero rule reward: answer accuracy plus a small bonus for the think/answer format.

Named in config.yaml as ``reward.default_fn: recipes/grpo/reward.py:r1_zero_reward`` (main.py passes
the absolute path, so the script runs from any folder). The reward workers load this file by path,
so it only needs to be importable on its own: it uses the library's rule-based pieces and nothing
from the recipe.
"""

from __future__ import annotations

from typing import Any

from hybridflow.rewards import think_answer_format_reward
from hybridflow.rewards.extract import answers_equal, extract_answer_tag

FORMAT_WEIGHT = 0.1
"""Below 1, so ``score >= 1`` still means "correct" (what ``trainer.validation.validate`` counts as accuracy)."""


def accuracy_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """1.0 when the content of the last ``<answer>...</answer>`` equals ``ground_truth``, else 0.0.

    Unlike the library's ``exact_match``, a response without an answer tag scores 0: the answer
    must be where the template asks for it.
    """
    answer = extract_answer_tag(solution_str)
    return float(answer is not None and answers_equal(answer, str(ground_truth)))


def r1_zero_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """``accuracy + FORMAT_WEIGHT * format``: in [0, 1.1]; the format term is the library's
    ``think_answer_format`` (exactly ``<think>...</think><answer>...</answer>``)."""
    accuracy = accuracy_reward(data_source, solution_str, ground_truth, extra_info)
    return accuracy + FORMAT_WEIGHT * think_answer_format_reward(
        data_source, solution_str, ground_truth, extra_info
    )
