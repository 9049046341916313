"""Per-token statistics of the policy's predictive distribution, computed in the training-layout forward.

A token statistic is a function of one chunk of logits::

    fn(logits, log_norm, labels) -> values

- ``logits [chunk, vocab]`` float32, already divided by the sampling temperature;
- ``log_norm [chunk]``: ``logsumexp(logits)``, computed once per chunk and shared by every statistic;
- ``labels [chunk]``: the token that follows each position (the one being scored);
- ``values [chunk]`` float32, one number per token.

The forward builds the logits ``chunk_size`` tokens at a time (`hybridflow.parallel.logprobs`), so no
statistic ever sees the whole ``[tokens, vocab]`` matrix. ``log_prob`` and ``entropy`` are registered here;
a recipe registers its own in its own file and asks for it by name::

    from hybridflow.parallel import register_token_statistic

    @register_token_statistic("max_prob")
    def max_prob(logits, log_norm, labels):
        return torch.exp(logits.max(-1).values - log_norm)

    rollouts |= actor.compute_log_prob(rollouts, temperature=1.0, stats=["log_prob", "max_prob"])

Names are resolved to functions in the controller (see `resolve_token_statistics`) and the functions are
shipped to the workers, which never import the recipe.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hybridflow.algos.registry import Registry

__all__ = [
    "TOKEN_STATISTICS",
    "TokenStatistic",
    "register_token_statistic",
    "resolve_token_statistics",
]

TokenStatisticFn = Callable[[Tensor, Tensor, Tensor], Tensor]

TOKEN_STATISTICS: Registry[TokenStatisticFn] = Registry("token statistic")


def register_token_statistic(name: str, *, override: bool = False) -> Callable[[TokenStatisticFn], TokenStatisticFn]:
    """Decorator registering ``fn(logits, log_norm, labels) -> [chunk]`` as a token statistic ``name``."""
    return TOKEN_STATISTICS.register(name, override=override)


@dataclass(frozen=True)
class TokenStatistic:
    """A statistic resolved for shipping: its name (the output column's name) and its function."""

    name: str
    fn: TokenStatisticFn


def resolve_token_statistics(stats: Sequence[str | TokenStatistic]) -> tuple[TokenStatistic, ...]:
    """Resolve names against `TOKEN_STATISTICS` in this process; `TokenStatistic` entries pass through.

    Raises:
        UnknownNameError: for a name not registered here (the message lists the valid ones).
        ValueError: for an empty list or a name asked twice.
    """
    resolved = tuple(s if isinstance(s, TokenStatistic) else TokenStatistic(s, TOKEN_STATISTICS.get(s)) for s in stats)
    names = [s.name for s in resolved]
    if not names:
        raise ValueError("ask for at least one token statistic (e.g. 'log_prob')")
    if len(set(names)) != len(names):
        raise ValueError(f"token statistics asked more than once: {names}")
    return resolved


@register_token_statistic("log_prob")
def label_log_prob(logits: Tensor, log_norm: Tensor, labels: Tensor) -> Tensor:
    """``log p(label)`` in nats."""
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_norm


@register_token_statistic("entropy")
def entropy(logits: Tensor, log_norm: Tensor, labels: Tensor) -> Tensor:
    """``H(p) = logsumexp(z) - sum_v p_v z_v`` in nats (never takes the log of an underflowed probability)."""
    probs = torch.exp(logits - log_norm.unsqueeze(-1))
    return log_norm - (probs * logits).sum(-1)


@register_token_statistic("self_certainty")
def self_certainty(logits: Tensor, log_norm: Tensor, labels: Tensor) -> Tensor:
    """``KL(U || p) = logsumexp(z) - mean_v z_v - log |V|`` in nats: how far the prediction is from uniform.

    Kang et al. 2025, "Scalable Best-of-N Selection for LLMs via Self-Certainty" (arXiv 2502.18581), the
    reward of INTUITOR (Zhao et al. 2025, arXiv 2505.19590). 0 for a uniform prediction, growing without
    bound as the prediction concentrates.
    """
    return log_norm - logits.mean(-1) - math.log(logits.shape[-1])
