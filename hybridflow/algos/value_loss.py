"""Critic loss for PPO with value clipping."""

from __future__ import annotations

import torch
from torch import Tensor

from hybridflow.algos.aggregation import AggregationMode, Count, aggregate_loss
from hybridflow.algos.masked import masked_mean

__all__ = ["clipped_value_loss"]


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    response_mask: Tensor,
    *,
    cliprange_value: float | None = 0.2,
    loss_agg_mode: AggregationMode = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    norm_constant: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Clipped squared-error value loss.

    Per token, with ``c = cliprange_value``::

        V_clip = clip(V, V_old - c, V_old + c)
        l      = 0.5 * max((V - R)^2, (V_clip - R)^2)

    The pessimistic max keeps the critic from moving further than ``c`` from the values that
    produced the advantages in one update, mirroring the policy's ratio clip. From the PPO
    reference implementation (Schulman et al., "Proximal Policy Optimization Algorithms",
    arXiv:1707.06347; OpenAI baselines ppo2), analysed in Engstrom et al., "Implementation Matters
    in Deep Policy Gradients" (arXiv:2005.12729). ``cliprange_value=None`` gives the plain
    ``0.5 * (V - R)^2``.

    Args:
        values: ``[batch, response_len]`` current critic predictions (with gradient).
        old_values: ``[batch, response_len]`` predictions when the batch was collected.
        returns: ``[batch, response_len]`` regression targets (e.g. GAE returns).
        response_mask: ``[batch, response_len]``, 1 for tokens in the loss.
        cliprange_value: ``c`` above, in the unit of the values.
        loss_agg_mode, global_token_count, global_seq_count, norm_constant: see
            :func:`hybridflow.algos.aggregation.aggregate_loss`.

    Returns:
        ``(loss, metrics)``: the scalar loss and ``{"clip_frac": fraction of valid tokens where the
        clamp changed V and the clipped term is the larger (so the token passes no gradient)}``,
        detached.
    """
    if not (values.shape == old_values.shape == returns.shape == response_mask.shape):
        raise ValueError(
            "values, old_values, returns and response_mask must share one shape; got "
            f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}, "
            f"{tuple(response_mask.shape)}"
        )
    unclipped = (values - returns) ** 2
    if cliprange_value is None:
        loss_mat = 0.5 * unclipped
        clip_active = torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        if cliprange_value < 0:
            raise ValueError(f"cliprange_value must be >= 0, got {cliprange_value}")
        # Clamping V itself returns V bit for bit inside the range, where V_old + (V - V_old) may
        # miss it by an ulp and so make the clipped term the larger by rounding alone.
        clipped_values = values.clamp(old_values - cliprange_value, old_values + cliprange_value)
        clipped = (clipped_values - returns) ** 2
        loss_mat = 0.5 * torch.maximum(unclipped, clipped)
        clip_active = (clipped_values != values) & (clipped > unclipped)
    loss = aggregate_loss(
        loss_mat, response_mask, loss_agg_mode, global_token_count, global_seq_count, norm_constant
    )
    return loss, {"clip_frac": masked_mean(clip_active.to(values.dtype), response_mask).detach()}
