"""Per-token statistics (log-probabilities, entropies, ...) from hidden states, in chunks of tokens.

A policy-gradient step needs ``log p(label)`` and the entropy for each token, never the whole
distribution. The ``[tokens, vocab]`` fp32 logits it is computed from are the largest activation of a
small model (vocab 150k x 8k tokens x 4 bytes = 4.8 GB), so they are built ``chunk_size`` tokens at a
time. Under autograd each chunk is checkpointed: only the chunk's hidden states are kept and its logits
are recomputed in backward, otherwise every chunk's logits would still be alive at backward time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils.checkpoint import checkpoint

from hybridflow.parallel.token_stats import TokenStatistic, resolve_token_statistics


def _chunk_stats(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    stats: tuple[TokenStatistic, ...],
) -> torch.Tensor:
    """``[chunk, len(stats)]``: each statistic of each token of the chunk."""
    # Softmax in fp32 whatever the compute dtype: bf16 log-probs are off by ~1e-2 nats.
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    return torch.stack([stat.fn(logits, log_norm, labels).float() for stat in stats], dim=-1)


def token_statistics(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    stats: Sequence[str | TokenStatistic],
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Token statistics (`hybridflow.parallel.token_stats`) of ``softmax(head(hidden) / temperature)``.

    Args:
        hidden: ``[tokens, hidden_size]`` final hidden states.
        head: maps ``[n, hidden_size]`` to logits ``[n, vocab]`` (the model's lm_head).
        labels: ``[tokens]`` the token that follows each position.
        stats: registered names or resolved `TokenStatistic` entries, e.g. ``("log_prob", "entropy")``.
        chunk_size: tokens whose logits exist at once; ``None`` computes all tokens at once.

    Returns:
        ``[tokens, len(stats)]`` float32, column ``k`` holding ``stats[k]``. Differentiable.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")
    resolved = resolve_token_statistics(stats)
    tokens = hidden.shape[0]
    step = chunk_size or max(tokens, 1)
    recompute = chunk_size is not None and torch.is_grad_enabled()
    pieces = []
    # No tokens still makes one (empty) chunk: the result then stays connected to the model's graph, so
    # a rank with nothing to score still runs a backward (FSDP2's collectives need every rank).
    for start in range(0, max(tokens, 1), step):
        args = (hidden[start : start + step], labels[start : start + step], head, temperature, resolved)
        pieces.append(
            checkpoint(_chunk_stats, *args, use_reentrant=False) if recompute else _chunk_stats(*args)
        )
    return torch.cat(pieces)


def token_log_probs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_probs [tokens]`` and (with ``with_entropy``) ``entropy [tokens]`` in nats: `token_statistics`
    for the two statistics every policy-gradient step uses."""
    names = ("log_prob", "entropy") if with_entropy else ("log_prob",)
    values = token_statistics(hidden, head, labels, names, temperature=temperature, chunk_size=chunk_size)
    return values[:, 0], (values[:, 1] if with_entropy else None)
