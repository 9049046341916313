"""Reducing metrics gathered from several ranks or micro-batches, and summary statistics of tensors.

Each metric has a *kind* saying how its values combine: ``mean`` (the default), ``sum``, ``max`` or
``min``. The kind comes from the first match among the caller's ``kinds`` (exact names or ``fnmatch``
patterns), then :data:`DEFAULT_KINDS`, which encode the naming conventions used across the library:
maxima end in ``/max`` or ``_max``, counts in ``/count``, and a step's time is the slowest rank's.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from numbers import Real
from typing import Any, Literal

import torch

__all__ = ["DEFAULT_KINDS", "MetricKind", "metric_kind", "reduce_metrics", "tensor_stats"]

MetricKind = Literal["mean", "sum", "max", "min"]

DEFAULT_KINDS: tuple[tuple[str, MetricKind], ...] = (
    ("*/max", "max"),
    ("*_max", "max"),
    ("*/min", "min"),
    ("*_min", "min"),
    ("*/sum", "sum"),
    ("*/count", "sum"),
    ("*_count", "sum"),
    ("timing_s/*", "max"),
)

_REDUCERS = {
    "mean": lambda values: math.fsum(values) / len(values),
    "sum": math.fsum,
    "max": max,
    "min": min,
}


def metric_kind(name: str, kinds: Mapping[str, MetricKind] | None = None) -> MetricKind:
    """How values of metric ``name`` combine: ``kinds`` first, then :data:`DEFAULT_KINDS`, else ``mean``."""
    for pattern, kind in (*(kinds or {}).items(), *DEFAULT_KINDS):
        if name == pattern or fnmatch.fnmatchcase(name, pattern):
            return kind
    return "mean"


def _numbers(name: str, value: Any) -> Iterable[float]:
    """The numbers held by one metric value: a number, a tensor, or a list of either."""
    if isinstance(value, torch.Tensor):
        return value.detach().double().flatten().tolist()
    if isinstance(value, list | tuple):
        return [number for item in value for number in _numbers(name, item)]
    if isinstance(value, Real) or hasattr(value, "item"):
        return [float(value)]
    raise TypeError(f"metric {name!r} holds {type(value).__name__}, not a number, tensor or list of numbers")


def reduce_metrics(
    metrics: Sequence[Mapping[str, Any]], kinds: Mapping[str, MetricKind] | None = None
) -> dict[str, float]:
    """Combine metric dicts (one per rank or micro-batch) into one, each metric by its kind.

    A value may be a number, a tensor or a list of them (e.g. one entry per micro-batch); every number
    counts once. A metric missing from some dicts is reduced over the dicts that have it.
    """
    gathered: dict[str, list[float]] = {}
    for entry in metrics:
        for name, value in entry.items():
            gathered.setdefault(name, []).extend(_numbers(name, value))
    return {
        name: float(_REDUCERS[metric_kind(name, kinds)](values))
        for name, values in gathered.items()
        if values
    }


def tensor_stats(name: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, float]:
    """``{name}/mean``, ``/std``, ``/min`` and ``/max`` of the entries of ``values`` where ``mask`` is true.

    ``std`` is the population standard deviation (0 for a single value). An empty selection gives an
    empty dict: no number describes nothing.
    """
    if mask is not None:
        if mask.shape != values.shape:
            raise ValueError(f"{name}: mask shape {tuple(mask.shape)} != values shape {tuple(values.shape)}")
        values = values[mask.bool()]
    selected = values.detach().double().flatten()
    if selected.numel() == 0:
        return {}
    return {
        f"{name}/mean": selected.mean().item(),
        f"{name}/std": selected.std(correction=0).item(),
        f"{name}/min": selected.min().item(),
        f"{name}/max": selected.max().item(),
    }
