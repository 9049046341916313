"""Per-token log-probabilities and entropies from hidden states, optionally in chunks of tokens.

A policy-gradient step needs ``log p(label)`` and the entropy for each token, never the whole
distribution. The ``[tokens, vocab]`` fp32 logits it is computed from are the largest activation of a
small model (vocab 150k x 8k tokens x 4 bytes = 4.8 GB), so they are built ``chunk_size`` tokens at a
time. Under autograd each chunk is checkpointed: only the chunk's hidden states are kept and its logits
are recomputed in backward, otherwise every chunk's logits would still be alive at backward time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint


def _chunk_stats(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    temperature: float,
    with_entropy: bool,
) -> torch.Tensor:
    """``[chunk, 1]`` log-probs, or ``[chunk, 2]`` log-probs and entropies, in nats."""
    # Softmax in fp32 whatever the compute dtype: bf16 log-probs are off by ~1e-2 nats.
    logits = head(hidden).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_norm = torch.logsumexp(logits, dim=-1)
    label_log_prob = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_norm
    if not with_entropy:
        return label_log_prob.unsqueeze(-1)
    probs = torch.exp(logits - log_norm.unsqueeze(-1))
    entropy = log_norm - (probs * logits).sum(-1)
    return torch.stack((label_log_prob, entropy), dim=-1)


def token_log_probs(
    hidden: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    labels: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of ``labels`` under ``log_softmax(head(hidden) / temperature)``, and its entropy.

    Args:
        hidden: ``[tokens, hidden_size]`` final hidden states.
        head: maps ``[n, hidden_size]`` to logits ``[n, vocab]`` (the model's lm_head).
        labels: ``[tokens]`` token ids to score.
        chunk_size: tokens per chunk; ``None`` computes all tokens at once.

    Returns:
        ``log_probs [tokens]`` in nats and ``entropy [tokens]`` in nats (``None`` unless asked).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if chunk_size is not None and chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive or None, got {chunk_size}")
    tokens = hidden.shape[0]
    step = chunk_size or max(tokens, 1)
    recompute = chunk_size is not None and torch.is_grad_enabled()
    pieces = []
    for start in range(0, tokens, step):
        args = (hidden[start : start + step], labels[start : start + step], head, temperature, with_entropy)
        pieces.append(
            checkpoint(_chunk_stats, *args, use_reentrant=False) if recompute else _chunk_stats(*args)
        )
    stats = (
        torch.cat(pieces) if pieces else hidden.new_zeros((0, 2 if with_entropy else 1), dtype=torch.float32)
    )
    return stats[:, 0], (stats[:, 1] if with_entropy else None)
