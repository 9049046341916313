"""Training-side log-probs that reproduce what the rollout engines report.

Both engines report, for each sampled token, its log-prob (nats) under the distribution the token was
actually drawn from: ``log_softmax`` of the logits divided by the temperature, after the top-k and
top-p filters set the logits of the dropped tokens to ``-inf``. (vLLM calls this
``logprobs_mode="processed_logprobs"``; transformers reports the same through ``output_scores``.)
With top-k and top-p disabled this is exactly ``log_softmax(logits / temperature)``. With greedy
decoding (temperature 0) no scaling or filter applies and it is ``log_softmax(logits)``.

``sampling_log_probs`` applies that recipe to logits; ``response_log_probs`` runs a causal LM over
prompt + response and returns the log-probs of the response tokens, so a trainer can compare them
with ``rollout_log_probs`` after every weight push.
"""

from __future__ import annotations

import torch
from torch import nn

from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams

__all__ = ["filter_logits", "response_log_probs", "sampling_log_probs"]


def filter_logits(
    logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0
) -> torch.Tensor:
    """The logits of the sampling distribution: scaled by ``1/temperature``, filtered by top-k then top-p.

    Args:
        logits: ``[..., vocab]`` raw model logits.
        temperature: 0 means greedy, which samples from the unscaled logits' argmax; it returns
            the logits unscaled and unfiltered, matching what the engines report for greedy tokens.
        top_k: keep the tokens whose scaled logit is at least the k-th largest; -1 disables.
        top_p: keep the most likely tokens until their cumulative probability exceeds ``top_p``
            (the most likely token is always kept); 1.0 disables.

    Returns:
        ``[..., vocab]`` float32 logits, dropped tokens set to ``-inf``.
    """
    scaled = logits.float()
    if temperature == 0:
        return scaled
    scaled = scaled / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth_largest = scaled.topk(top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    if top_p < 1.0:
        ascending, order = scaled.sort(dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - top_p
        drop_sorted[..., -1] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def sampling_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probs (nats) of ``tokens [...]`` under the sampling distribution of ``logits [..., vocab]``.

    Returns a float32 tensor shaped like ``tokens``. A token removed by top-k/top-p gets ``-inf``; an
    engine can never have sampled such a token.
    """
    filtered = filter_logits(logits, temperature, top_k, top_p)
    return filtered.log_softmax(dim=-1).gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def response_log_probs(model: nn.Module, rollouts: Batch, sampling: SamplingParams) -> torch.Tensor:
    """Recompute ``rollout_log_probs`` with a causal LM (the training layout's view of the same samples).

    Args:
        model: a causal LM called as ``model(input_ids=, attention_mask=, position_ids=)`` returning
            ``.logits [batch, seq, vocab]`` (an HF model, also when wrapped by FSDP2).
        rollouts: the output of ``RolloutEngine.generate``: ``input_ids``/``attention_mask``
            ``[batch, prompt_len]`` (left-padded), ``responses``/``response_mask`` ``[batch, response_len]``.
        sampling: the parameters the rollouts were drawn with (temperature, top_k, top_p).

    Returns:
        ``[batch, response_len]`` float32 log-probs in nats, 0 where ``response_mask`` is 0.
    """
    prompt_len = rollouts["input_ids"].shape[1]
    response_len = rollouts["responses"].shape[1]
    input_ids = torch.cat([rollouts["input_ids"], rollouts["responses"]], dim=1)
    attention_mask = torch.cat([rollouts["attention_mask"], rollouts["response_mask"]], dim=1).long()
    # Left padding shifts every prompt; positions must count real tokens only, as the engines do.
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    # The logit at position t predicts token t + 1, so responses are read one step to the left.
    response_logits = logits[:, prompt_len - 1 : prompt_len - 1 + response_len]
    log_probs = sampling_log_probs(
        response_logits, rollouts["responses"], sampling.temperature, sampling.top_k, sampling.top_p
    )
    return log_probs.masked_fill(rollouts["response_mask"] == 0, 0.0)
