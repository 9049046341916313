"""Rule-based reward functions, called directly."""

import pytest

from hybridflow.rewards import (
    exact_match_reward,
    get_reward_function,
    math_verify_reward,
    think_answer_format_reward,
)


def score(fn, response, truth):
    return fn(data_source="test", solution_str=response, ground_truth=truth, extra_info=None)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so the answer is $\\boxed{\\frac{1}{2}}$.", "0.5", 1.0),
        ("so the answer is $\\boxed{\\frac{1}{3}}$.", "0.5", 0.0),
        ("\\boxed{42}, not the 41 above", "42", 1.0),
        # Hedging: two boxed answers count as the set {41, 42}.
        ("First \\boxed{41}, no wait: \\boxed{42}", "42", 0.0),
        ("<think>6*7 is 42, or 41?</think><answer>42</answer>", "42", 1.0),
        ("<think>maybe 42</think><answer>41</answer> though 42", "42", 0.0),
        ("<answer>\\frac{84}{2}</answer>", "42", 1.0),
        ("The answer is 42", "42", 1.0),
        ("The answer is 43", "42", 0.0),
        ("I do not know.", "42", 0.0),
        ("<answer>x^2 + 2x + 1</answer>", "(x+1)^2", 1.0),
    ],
)
def test_math_verify_boxed_tagged_and_plain_answers(response, truth, expected):
    assert score(math_verify_reward, response, truth) == expected


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>7+5 is 12</think><answer>12</answer>", 1.0),
        ("  <think>\nlong\nthoughts\n</think>\n<answer> 12 </answer>\n", 1.0),
        ("<think></think><answer>12</answer>", 1.0),
        ("<answer>12</answer>", 0.0),
        ("<answer>12</answer><think>x</think>", 0.0),
        ("<think>x</think><answer>12</answer> and more", 0.0),
        ("preamble <think>x</think><answer>12</answer>", 0.0),
        ("<think>x</think><answer>  </answer>", 0.0),
        ("<think>x<answer>1</answer></think><answer>12</answer>", 0.0),
        ("<think>x</think><answer>1</answer><answer>12</answer>", 0.0),
        ("<think>x</think><answer>12", 0.0),
    ],
)
def test_think_answer_format(response, expected):
    assert score(think_answer_format_reward, response, None) == expected


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("<answer>57</answer>", "57", 1.0),
        ("<think>12+45</think><answer> 057 </answer>", "57", 1.0),
        ("<answer>58</answer> but really 57", "57", 0.0),
        ("<answer>fifty-seven</answer>", "57", 0.0),
        ("57", "57", 1.0),
        ("12+45=57", "57", 1.0),
        ("12+45=56", "57", 0.0),
        ("-33", "-33", 1.0),
        ("33", "-33", 0.0),
        ("total: 1,234.", "1234", 1.0),
        ("<answer>abc</answer>", "abc", 1.0),
        ("no number here", "57", 0.0),
        ("57", 57, 1.0),
    ],
)
def test_exact_match_takes_the_answer_tag_or_the_last_number(response, truth, expected):
    assert score(exact_match_reward, response, truth) == expected


def test_builtins_are_registered_by_name():
    assert get_reward_function("exact_match") is exact_match_reward
    assert get_reward_function("math_verify") is math_verify_reward
    assert get_reward_function("think_answer_format") is think_answer_format_reward
    with pytest.raises(KeyError, match=r"'nope'.*registered: \[.*'exact_match'"):
        get_reward_function("nope")
