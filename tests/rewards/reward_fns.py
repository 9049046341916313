"""Reward functions that misbehave on purpose, loaded by the RewardManager tests as 'reward_fns.py:name'."""

import decimal
import fractions
import json
import numbers
import os
import signal
import time

import numpy as np


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


class _RealWithBadFloat:
    """Claims to be a real number (registered below) but ``float()`` of it fails or is not finite."""

    def __init__(self, outcome):
        self.outcome = outcome

    def __float__(self):
        if self.outcome == "raise":
            raise ValueError("no float for you")
        return self.outcome


numbers.Real.register(_RealWithBadFloat)


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("cannot print this error")


def returns_built_value(data_source, solution_str, ground_truth, extra_info=None):
    """Returns the value that ``ground_truth``, a JSON ``[kind, parameter]``, describes: the fuzz test's
    way to make a worker return anything at all."""
    kind, parameter = json.loads(ground_truth)
    if kind == "raise":
        raise ValueError(parameter)
    if kind == "raise_unprintable":
        raise _UnprintableError
    builders = {
        "none": lambda p: None,
        "text": str,
        "float": float,
        "int": int,
        "bool": bool,
        "np_float32": np.float32,
        "np_int64": np.int64,
        "ndarray": lambda p: np.array([p]),
        "list": lambda p: [p],
        "dict": lambda p: {"score": p},
        "fraction": lambda p: fractions.Fraction(*p),
        "decimal": lambda p: decimal.Decimal(repr(p)),
        "complex": lambda p: complex(p, 1.0),
        "real_bad_float": _RealWithBadFloat,
    }
    if kind == "tensor":
        import torch  # imported already by prepare, outside the sample's timer

        return torch.tensor(parameter)
    return builders[kind](parameter)


def _import_torch():
    import torch  # noqa: F401  (seconds of import, once per worker, before it reports ready)


returns_built_value.prepare = _import_torch
