"""Reward functions that misbehave on purpose, loaded by the RewardManager tests as 'reward_fns.py:name'."""

import os
import signal
import time


def echo_ground_truth(data_source, solution_str, ground_truth, extra_info=None):
    """A well-behaved function whose score the test can predict: the ground truth as a number, plus
    ``extra_info["bonus"]`` when given."""
    return float(ground_truth) + (extra_info or {}).get("bonus", 0.0)


def raising(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError(f"cannot score {solution_str!r}")


def hanging(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(60)
    return 1.0


def wrong_type(data_source, solution_str, ground_truth, extra_info=None):
    return "1.0"


def not_a_number(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan")


def hanging_deaf_to_alarm(data_source, solution_str, ground_truth, extra_info=None):
    """Hangs with SIGALRM blocked, as C code that never returns to the interpreter would."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)
    return 1.0


def crashing(data_source, solution_str, ground_truth, extra_info=None):
    os._exit(3)


def hanging_unless_number(data_source, solution_str, ground_truth, extra_info=None):
    """Scores a numeric ground truth at once and hangs (until the alarm) on any other."""
    try:
        return float(ground_truth)
    except ValueError:
        time.sleep(60)
        return 1.0
