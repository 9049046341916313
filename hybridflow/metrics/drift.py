"""Drift of a reward distribution: two-sample scores and a per-data-source window tracker.

Two pure scores compare a *reference* sample of rewards with a *current* one (1-D, any real values):

- :func:`population_stability_index` (PSI, from credit-risk model monitoring; e.g. Yurdakul,
  "Statistical Properties of Population Stability Index", 2018): ``sum_i (c_i - r_i) * ln(c_i / r_i)``
  over bins ``i``, with ``r_i``/``c_i`` the share of the reference/current sample in the bin. 0 for
  identical histograms; the customary reading is < 0.1 stable, 0.1-0.25 moderate, > 0.25 a major shift.
- :func:`ks_statistic`: the two-sample Kolmogorov-Smirnov statistic, ``sup_x |F_ref(x) - F_cur(x)|``
  over the empirical distribution functions, in ``[0, 1]``.

:class:`RewardDriftTracker` keeps, per ``data_source``, the latest ``window`` rewards (the current window)
and a reference window of the same size, and scores the two with both functions.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import Tensor

__all__ = ["DriftReference", "DriftScore", "RewardDriftTracker", "ks_statistic", "population_stability_index"]

DriftReference = Literal["previous", "first"]


def _sample(name: str, values: Sequence[float] | Tensor) -> np.ndarray:
    """``values`` as a float64 ``[n]`` array; a ValueError names the empty or non-finite window."""
    if isinstance(values, Tensor):
        values = values.detach().cpu().double().numpy()
    sample = np.asarray(values, dtype=np.float64).ravel()
    if sample.size == 0:
        raise ValueError(f"the {name} window is empty: drift needs at least one value on each side")
    if not np.isfinite(sample).all():
        raise ValueError(f"the {name} window holds a NaN or infinite value")
    return sample


def population_stability_index(
    reference: Sequence[float] | Tensor, current: Sequence[float] | Tensor, bins: int = 10, eps: float = 1e-4
) -> float:
    """PSI of ``current [m]`` against ``reference [n]``, in nats (natural log).

    Bins are cut at the reference's quantiles ``k / bins`` (``k = 1 .. bins-1``, linear interpolation),
    duplicates merged, each bin closed on the right: ``(-inf, e_1], (e_1, e_2], ..., (e_last, inf)``. So a
    discrete reward (0/1, or a few levels) gets one bin per level, and values outside the reference's
    range fall in the outer bins. A share below ``eps`` counts as ``eps``, which keeps an empty bin finite.

    Edge cases: an empty window or a non-finite value raises ``ValueError``. Two windows holding the same
    single constant give 0; a constant reference and a current sample wholly above it share no bin and
    give ``2 * (1 - eps) * ln(1 / eps)`` (18.4 at the default ``eps``).
    """
    if bins < 2:
        raise ValueError(f"population_stability_index needs bins >= 2, got {bins}")
    ref = _sample("reference", reference)
    cur = _sample("current", current)
    # numpy, not torch: on tensors this small torch's per-call overhead dominates.
    edges = np.unique(np.quantile(ref, np.arange(1, bins) / bins))
    ref_share = np.maximum(_bin_shares(ref, edges), eps)
    cur_share = np.maximum(_bin_shares(cur, edges), eps)
    return float(np.sum((cur_share - ref_share) * np.log(cur_share / ref_share)))


def _bin_shares(sample: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Share of ``sample`` in each of the ``len(edges) + 1`` right-closed bins that ``edges`` cut."""
    index = np.searchsorted(edges, sample, side="left")
    return np.bincount(index, minlength=edges.size + 1) / sample.size


def ks_statistic(reference: Sequence[float] | Tensor, current: Sequence[float] | Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic ``max_x |F_ref(x) - F_cur(x)|`` in ``[0, 1]``.

    The empirical CDFs are compared at every value either window holds, so ties and discrete rewards are
    exact. Edge cases: an empty window or a non-finite value raises ``ValueError``; two windows of the
    same constant give 0, two different constants give 1.
    """
    ref = np.sort(_sample("reference", reference))
    cur = np.sort(_sample("current", current))
    points = np.unique(np.concatenate([ref, cur]))
    ref_cdf = np.searchsorted(ref, points, side="right") / ref.size
    cur_cdf = np.searchsorted(cur, points, side="right") / cur.size
    return float(np.max(np.abs(ref_cdf - cur_cdf)))


class DriftScore(NamedTuple):
    """Drift of one data source's current window against its reference window."""

    psi: float
    ks: float


class RewardDriftTracker:
    """Per ``data_source``, a current window of its latest ``window`` rewards and a reference window.

    ``reference="previous"`` (a change detector): the reference is the ``window`` rewards just before
    the current window, so a slow, steady improvement scores low while a jump scores high until the
    reference window has filled with post-jump rewards (``2 * window`` samples after the jump).
    ``reference="first"``: the reference is the source's first ``window`` rewards, frozen, so any
    departure from the start of the run counts, learning included.

    A source is scored once it has ``2 * window`` rewards (the two windows never overlap).
    """

    def __init__(self, window: int, reference: DriftReference = "previous") -> None:
        if window < 1:
            raise ValueError(f"RewardDriftTracker needs window >= 1, got {window}")
        if reference not in ("previous", "first"):
            raise ValueError(f"RewardDriftTracker reference must be 'previous' or 'first', got {reference!r}")
        self.window = window
        self.reference = reference
        # "previous": one deque of 2 * window (reference = older half); "first": a frozen list and a deque.
        self._recent: dict[str, deque[float]] = {}
        self._first: dict[str, list[float]] = {}

    @property
    def sources(self) -> list[str]:
        """Data sources seen so far, sorted."""
        return sorted(self._recent)

    def add(self, sources: Iterable[str], rewards: Sequence[float] | Tensor) -> None:
        """Append one step's rewards ``[batch]``, each to the window of its row's data source."""
        values = torch.as_tensor(rewards, dtype=torch.float64).flatten().tolist()
        names = [str(source) for source in sources]
        if len(names) != len(values):
            raise ValueError(f"{len(names)} data sources for {len(values)} rewards")
        for source, value in zip(names, values, strict=True):
            self._append(source, value)

    def _append(self, source: str, value: float) -> None:
        if self.reference == "previous":
            self._recent.setdefault(source, deque(maxlen=2 * self.window)).append(value)
            return
        first = self._first.setdefault(source, [])
        recent = self._recent.setdefault(source, deque(maxlen=self.window))
        if len(first) < self.window:
            first.append(value)
        else:
            recent.append(value)

    def windows(self, source: str) -> tuple[list[float], list[float]] | None:
        """``(reference, current)`` rewards of ``source``, or ``None`` until both windows are full."""
        recent = list(self._recent.get(source, ()))
        if self.reference == "previous":
            if len(recent) < 2 * self.window:
                return None
            return recent[: self.window], recent[self.window :]
        if len(recent) < self.window:
            return None
        return list(self._first[source]), recent

    def scores(self, bins: int) -> dict[str, DriftScore]:
        """:class:`DriftScore` of every source whose windows are full, by source."""
        out: dict[str, DriftScore] = {}
        for source in self.sources:
            pair = self.windows(source)
            if pair is not None:
                reference, current = pair
                out[source] = DriftScore(
                    population_stability_index(reference, current, bins), ks_statistic(reference, current)
                )
        return out

    def state_dict(self) -> dict[str, Any]:
        """The windows as plain lists (for a checkpoint)."""
        return {
            "recent": {source: list(values) for source, values in self._recent.items()},
            "first": {source: list(values) for source, values in self._first.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the windows from :meth:`state_dict`."""
        size = 2 * self.window if self.reference == "previous" else self.window
        self._recent = {source: deque(values, maxlen=size) for source, values in state["recent"].items()}
        self._first = {source: list(values) for source, values in state["first"].items()}
