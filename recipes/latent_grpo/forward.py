"""The training-layout forward of a latent rollout: input embeddings rebuilt from the stored steps, and
each response position's log-prob (Gumbel log-density at latent positions, the usual log-prob elsewhere)."""

from __future__ import annotations

import torch
from torch import nn

from hybridflow.parallel.packing import position_ids_from_mask
from hybridflow.protocol import Batch
from recipes.latent_grpo.latent import latent_log_density, soft_embeddings

__all__ = ["latent_sequence_log_probs", "sequence_embeddings"]


def sequence_embeddings(batch: Batch, embedding: torch.Tensor, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt and response as input embeddings: ``[batch, prompt_len + response_len, hidden]`` and the
    joined ``attention_mask``.

    Token positions take ``embedding[id]``; latent positions (``latent_mask``) take the soft embedding of
    their stored ``latent_ids`` and ``latent_g`` at mixture temperature ``tau``, the input the rollout fed.
    The result is detached: the inputs are data, not parameters being trained.
    """
    embedding = embedding.detach()
    response = embedding[batch["responses"]]
    soft = soft_embeddings(batch["latent_ids"], batch["latent_g"], tau, embedding)
    response = torch.where(batch["latent_mask"].bool().unsqueeze(-1), soft, response)
    embeds = torch.cat([embedding[batch["input_ids"]], response], dim=1)
    mask = torch.cat([batch["attention_mask"], batch["response_mask"]], dim=1)
    return embeds, mask


def latent_sequence_log_probs(
    model: nn.Module, batch: Batch, embedding: torch.Tensor, tau: float, temperature: float
) -> torch.Tensor:
    """``[batch, response_len]`` log-probs (nats) of each response position under ``model``, 0 on padding.

    Latent positions: `latent_log_density` of the stored ``latent_g`` under the model's temperature-1
    log-probs of the stored ``latent_ids``, with the straight-through sign flip where the batch's
    ``advantages`` are <= 0 (only when the batch has them: in the update). Token positions:
    ``log_softmax(logits / temperature)`` at the token. Differentiable in the model's parameters.
    """
    embeds, mask = sequence_embeddings(batch, embedding, tau)
    logits = model(
        inputs_embeds=embeds, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False
    ).logits
    width = batch["responses"].shape[1]
    # The logits at position j predict position j + 1.
    predicting = logits[:, -width - 1 : -1].float()
    explicit = (predicting / temperature).log_softmax(dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    candidates = predicting.log_softmax(dim=-1).gather(-1, batch["latent_ids"])
    flip = batch["advantages"] <= 0 if "advantages" in batch else None
    latent = latent_log_density(candidates, batch["latent_g"], flip)
    values = torch.where(batch["latent_mask"].bool(), latent, explicit)
    return values * batch["response_mask"]
