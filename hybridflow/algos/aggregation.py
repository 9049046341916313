"""Reduce a per-token loss matrix ``[batch, response_len]`` to the scalar that is back-propagated.

Modes (registered in ``AGGREGATION_MODES``), with ``l_it`` the loss of token ``t`` of sequence ``i``,
``m_it`` the mask, ``n_i = #{t: m_it != 0}`` and ``S`` the sequences with ``n_i > 0``:

========================== =====================================================================
``token-mean``             ``sum_i sum_t m_it l_it / N``, ``N = sum_i n_i`` (every token weighs
                           the same; DAPO, arXiv:2503.14476)
``seq-mean-token-mean``    ``(1/|S|) sum_{i in S} (sum_t m_it l_it / n_i)`` (every sequence weighs
                           the same; GRPO as written in arXiv:2402.03300)
``seq-mean-token-sum``     ``(1/|S|) sum_{i in S} sum_t m_it l_it``
``seq-mean-token-sum-norm`` ``(1/|S|) sum_{i in S} sum_t m_it l_it / C`` with a constant ``C``
                           (e.g. the maximum response length), which removes the length bias of
                           ``1/n_i`` (Dr. GRPO, arXiv:2503.20783)
========================== =====================================================================

Global normalisers, and why micro-batches then sum to the full batch
--------------------------------------------------------------------
A training step splits its mini-batch across data-parallel ranks and, on each rank, into
micro-batches whose gradients are accumulated (summed). Every mode above is a sum of per-token
(``token-mean``) or per-sequence (``seq-mean-*``) terms divided by ONE batch-wide count. If each
micro-batch divided by its own count, the step would compute a mean of micro-batch means, which
depends on how the batch was cut (a short micro-batch's tokens would weigh more).

So the caller counts once, over the whole mini-batch (all micro-batches, all ranks), and passes

* ``global_token_count = N_total`` (valid tokens) for ``token-mean``;
* ``global_seq_count = |S_total|`` (sequences with at least one valid token) for ``seq-mean-*``;
* ``norm_constant = C`` for ``seq-mean-token-sum-norm`` (a config constant, NOT the padded width of
  the micro-batch, which differs between micro-batches).

Micro-batch ``k`` then returns ``L_k = (sum of its terms) / N_total``, and because the numerator is
a plain sum over disjoint parts, ``sum_k L_k`` equals the full-batch value exactly (up to float
rounding), and so does the sum of their gradients. Data parallelism: ``sum_k`` runs over the
micro-batches of ALL ranks; gradient all-reduces that *average* over ``W`` ranks (FSDP, DDP) give
``1/W`` of that sum, so multiply the loss by ``W`` (or pass ``N_total / W``) to keep the exact
full-batch gradient.

Per-token loss weights
----------------------
``mask`` may hold per-token loss weights ``>= 0`` instead of 0/1 (a step's ``loss_mask``,
`hybridflow.contract.loss_response_mask`). A token's weight multiplies its loss term (the ``m_it l_it``
above); every count (``N``, ``n_i``, ``S``) counts the tokens whose weight is non-zero, each once. So a
0/1 weight is a mask, bit for bit, and a weight of 1 everywhere is no weight at all; a weight of 2 on a
token counts its loss twice, and does not change the normaliser. A registered mode must follow the
same rule for the policy, KL and entropy terms to honour the weights.

When a count is ``None``, the local count of ``mask`` is used: right for a single full batch,
wrong (a mean of means) under micro-batching. Padding rows (all-zero mask), such as those added to
make a batch divisible by the world size, contribute nothing and are not counted.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from hybridflow.algos.masked import masked_sum, weighted_sum
from hybridflow.algos.registry import AGGREGATION_MODES, register_aggregation_mode

__all__ = [
    "AggregationMode",
    "aggregate_loss",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "token_mean",
]

Count = int | float | Tensor | None
# A registered name, or the function itself (as the actor ships it to its workers, which may not
# know a name that a recipe registered in the controller process).
AggregationMode = str | Callable[..., Tensor]


def _nonzero(count: int | float | Tensor) -> int | float | Tensor:
    # A batch with no valid token has a zero numerator too; dividing by 1 returns 0 instead of nan.
    if isinstance(count, Tensor):
        return torch.where(count > 0, count, torch.ones_like(count))
    return count if count > 0 else 1


def _check(loss_mat: Tensor, mask: Tensor) -> None:
    if loss_mat.shape != mask.shape:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ in shape")
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [batch, response_len], got shape {tuple(loss_mat.shape)}")


def _seq_count(mask: Tensor, global_seq_count: Count) -> int | float | Tensor:
    if global_seq_count is not None:
        return _nonzero(global_seq_count)
    return _nonzero(mask.bool().any(dim=-1).sum())


@register_aggregation_mode("token-mean")
def token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> Tensor:
    """``sum(mask * loss_mat) / N`` with ``N = global_token_count`` or, if ``None``, the number of
    tokens whose ``mask`` is non-zero.

    Shapes: ``loss_mat``, ``mask`` ``[batch, response_len]`` -> scalar. Used by DAPO
    (arXiv:2503.14476) so long sequences are not down-weighted.
    """
    _check(loss_mat, mask)
    count = global_token_count if global_token_count is not None else mask.bool().sum()
    return weighted_sum(loss_mat, mask) / _nonzero(count)


@register_aggregation_mode("seq-mean-token-mean")
def seq_mean_token_mean(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> Tensor:
    """``(1/S) sum_i (sum_t m_it l_it / n_i)``, ``S = global_seq_count`` or the local number of
    sequences with a valid token.

    Shapes: ``[batch, response_len]`` -> scalar. The original GRPO objective (arXiv:2402.03300).
    """
    _check(loss_mat, mask)
    per_token = masked_sum(torch.ones_like(loss_mat), mask, dim=-1).clamp(min=1)
    per_seq = weighted_sum(loss_mat, mask, dim=-1) / per_token
    return per_seq.sum() / _seq_count(mask, global_seq_count)


@register_aggregation_mode("seq-mean-token-sum")
def seq_mean_token_sum(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> Tensor:
    """``(1/S) sum_i sum_t m_it l_it``, ``S`` as in :func:`seq_mean_token_mean`.

    Shapes: ``[batch, response_len]`` -> scalar.
    """
    _check(loss_mat, mask)
    return weighted_sum(loss_mat, mask, dim=-1).sum() / _seq_count(mask, global_seq_count)


@register_aggregation_mode("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss_mat: Tensor,
    mask: Tensor,
    *,
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> Tensor:
    """``(1/S) sum_i sum_t m_it l_it / C``, ``C = norm_constant`` or, if ``None``, ``response_len``.

    Shapes: ``[batch, response_len]`` -> scalar. Dr. GRPO (Liu et al., "Understanding R1-Zero-Like
    Training: A Critical Perspective", arXiv:2503.20783) replaces GRPO's ``1/n_i`` with a constant
    so that long wrong answers are not penalised less per token. Pass the configured maximum
    response length as ``C``: the ``None`` fallback is the padded width of THIS tensor, which can
    differ between micro-batches.
    """
    _check(loss_mat, mask)
    constant = float(norm_constant) if norm_constant is not None else float(loss_mat.shape[-1])
    if constant <= 0:
        raise ValueError(f"norm_constant must be positive, got {norm_constant}")
    return weighted_sum(loss_mat, mask, dim=-1).sum() / constant / _seq_count(mask, global_seq_count)


def aggregate_loss(
    loss_mat: Tensor,
    mask: Tensor,
    mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Reduce ``loss_mat [batch, response_len]`` over valid tokens with the registered ``mode``;
    ``mask [batch, response_len]`` is 0/1 or per-token loss weights >= 0 (module docstring).

    ``mode`` is a name in ``AGGREGATION_MODES`` or an aggregation function of that calling
    convention (e.g. one resolved from a name in another process); both are called the same way.

    See the module docstring for the modes' formulas and for how ``global_token_count`` /
    ``global_seq_count`` / ``norm_constant`` make micro-batch results sum to the full-batch value.

    Raises:
        UnknownNameError: unknown ``mode`` (the message lists the valid ones).
    """
    fn = AGGREGATION_MODES.resolve(mode)
    return fn(  # type: ignore[return-value]
        loss_mat,
        mask,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        norm_constant=norm_constant,
    )
