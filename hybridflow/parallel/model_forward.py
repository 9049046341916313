"""Training-layout forward of an HF causal LM that returns per-token log-probs, packed or padded.

How packing reaches the attention kernel (transformers 5.x; Qwen2 and the other models whose masks come
from ``masking_utils``). The packed row always carries ``position_ids`` that restart at 0 for each
sequence (RoPE positions); what tells attention where sequences end depends on the implementation:

* ``flash_attention_2/3`` (GPU): ``attention_mask=None`` and the varlen kwargs ``cu_seq_lens_q/k``,
  ``max_length_q/k``, passed explicitly so transformers does not re-derive them from ``position_ids``.
* ``hybridflow_varlen_sdpa`` (CPU default for training, see ``varlen_attention``): the same varlen
  kwargs, and an all-ones 2-d mask so that transformers builds no mask at all; one causal SDPA per
  sequence.
* ``sdpa`` / ``eager`` / ``flex_attention``: ``attention_mask=None``; ``create_causal_mask`` detects the
  restarts in ``position_ids`` and builds a block-diagonal causal mask over the whole packed row
  (correct, but ``total_tokens^2`` scores and memory).

The lm_head is run by :func:`hybridflow.parallel.logprobs.token_log_probs` inside the model's own forward
(the head's ``forward`` is swapped for the duration of the call): under FSDP2 the head's weight is
gathered only during the root module's forward, and computing there never builds the full logits.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from hybridflow.parallel.logprobs import token_statistics
from hybridflow.parallel.packing import PackedSequences, pack_sequences, position_ids_from_mask, unpack_tokens
from hybridflow.parallel.shared_prefix import shared_prefix_layout
from hybridflow.parallel.token_stats import TokenStatistic, resolve_token_statistics
from hybridflow.parallel.varlen_attention import VARLEN_SDPA

# Config keys of models that transform logits after the lm_head; the fused head would skip that step.
_LOGIT_POSTPROCESSING_KEYS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass(frozen=True)
class TokenLogProbs:
    """Per-token statistics aligned with ``input_ids [batch, seq_len]``, by statistic name.

    ``values["log_prob"][b, t] = log p(input_ids[b, t] | input_ids[b, :t])`` in nats; every statistic is
    0 where ``t`` is the first valid token of its row or a pad, and otherwise describes that same
    predictive distribution (``entropy`` in nats, or a recipe's own; see `hybridflow.parallel.token_stats`).
    The response part is ``[:, -response_len:]``.
    """

    values: dict[str, torch.Tensor]

    @property
    def log_probs(self) -> torch.Tensor:
        """``values["log_prob"]``."""
        return self.values["log_prob"]

    @property
    def entropy(self) -> torch.Tensor | None:
        """``values["entropy"]``, or ``None`` when it was not asked for."""
        return self.values.get("entropy")

    def response(self, response_len: int) -> TokenLogProbs:
        """The last ``response_len`` columns: ``[batch, response_len]``."""
        return TokenLogProbs({name: value[:, -response_len:] for name, value in self.values.items()})


def _check_plain_head(model: nn.Module) -> None:
    config = model.config
    for key in _LOGIT_POSTPROCESSING_KEYS:
        if getattr(config, key, None) not in (None, 1.0):
            raise NotImplementedError(
                f"{type(model).__name__} post-processes logits ({key}={getattr(config, key)}), which the "
                "token log-prob head does not reproduce"
            )


@contextmanager
def _head_scores_labels(
    model: nn.Module,
    labels: torch.Tensor,
    temperature: float,
    chunk_size: int | None,
    stats: tuple[TokenStatistic, ...],
    positions: torch.Tensor | None = None,
) -> Iterator[None]:
    """While active, the model's ``logits`` output is ``[batch, seq, len(stats)]``; with ``positions``
    (flat indices into ``[batch * seq]``) it is ``[1, len(positions), len(stats)]``, the statistics of
    those positions alone (``labels`` then holds one label per position)."""
    _check_plain_head(model)
    head = model.get_output_embeddings()
    head_forward = head.forward

    def scores(hidden: torch.Tensor) -> torch.Tensor:
        flat, shape = hidden.reshape(-1, hidden.shape[-1]), hidden.shape[:-1]
        if positions is not None:
            flat, shape = flat[positions], (1, len(positions))
        values = token_statistics(
            flat, head_forward, labels, stats, temperature=temperature, chunk_size=chunk_size
        )
        # A copy, not a view: FSDP2 hooks the root's outputs for backward and warns that in-place ops on
        # a view would bypass that hook. The copy is [tokens, len(stats)] floats.
        return values.view(*shape, values.shape[-1]).clone()

    head.forward = scores
    try:
        yield
    finally:
        del head.forward


def packing_kwargs(model: nn.Module, packed: PackedSequences) -> dict:
    """Model kwargs that make attention respect the sequence boundaries of ``packed``."""
    impl = str(getattr(model.config, "_attn_implementation", ""))
    kwargs: dict = {"position_ids": packed.position_ids, "attention_mask": None}
    if "flash" in impl or impl == VARLEN_SDPA:
        kwargs.update(
            cu_seq_lens_q=packed.cu_seqlens,
            cu_seq_lens_k=packed.cu_seqlens,
            max_length_q=packed.max_seqlen,
            max_length_k=packed.max_seqlen,
        )
    if impl == VARLEN_SDPA:
        # No padding in the row: transformers then skips mask construction (the varlen kwargs mask).
        kwargs["attention_mask"] = torch.ones_like(packed.input_ids)
    return kwargs


def _split_stats(values: torch.Tensor, stats: tuple[TokenStatistic, ...]) -> TokenLogProbs:
    return TokenLogProbs({stat.name: values[..., k] for k, stat in enumerate(stats)})


def packed_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    stats: Sequence[str | TokenStatistic] = ("log_prob",),
) -> TokenLogProbs:
    """Forward ``input_ids [batch, seq_len]`` with all valid tokens packed into one row.

    ``attention_mask [batch, seq_len]`` marks the valid tokens (left, right or both-sided padding).
    ``stats`` names the token statistics to compute (`hybridflow.parallel.token_stats`); ``chunk_size``
    bounds the tokens whose logits exist at once. Differentiable.
    """
    stats = resolve_token_statistics(stats)
    packed = pack_sequences(input_ids, attention_mask)
    # Token j's distribution scores token j + 1; at a sequence's last token that would be the next
    # sequence's first token, and those entries are dropped below.
    labels = torch.roll(packed.input_ids, shifts=-1, dims=1).flatten()
    kwargs = packing_kwargs(model, packed)
    with _head_scores_labels(model, labels, temperature, chunk_size, stats):
        values = model(input_ids=packed.input_ids, use_cache=False, **kwargs).logits[0]
    # Move each score from the predicting token to the predicted one. A sequence's first token has no
    # prediction inside its sequence (its slot received the previous sequence's last score): zero it.
    starts = packed.position_ids[0] == 0
    values = torch.cat((values.new_zeros(1, values.shape[-1]), values[:-1]))
    values = torch.where(starts.unsqueeze(-1), 0.0, values)
    per_token = torch.stack([unpack_tokens(values[:, k], packed) for k in range(values.shape[-1])], dim=-1)
    return _split_stats(per_token, stats)


def shared_prefix_log_probs(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    stats: Sequence[str | TokenStatistic] = ("log_prob",),
) -> TokenLogProbs:
    """Token statistics of the response tokens, ``[batch, response_len]`` each, from one packed forward in
    which every distinct prompt runs once (`hybridflow.parallel.shared_prefix`).

    ``prompt_ids``/``prompt_mask [batch, prompt_len]`` and ``responses``/``response_mask [batch,
    response_len]`` as in the rollouts. Equal to ``packed_log_probs`` on the joined rows, response part,
    up to float rounding; 0 at response pads. Needs the ``hybridflow_varlen_sdpa`` attention. Differentiable.
    """
    impl = str(getattr(model.config, "_attn_implementation", ""))
    if impl != VARLEN_SDPA:
        raise ValueError(f"shared-prefix packing needs attention {VARLEN_SDPA!r}, the model has {impl!r}")
    stats = resolve_token_statistics(stats)
    layout = shared_prefix_layout(prompt_ids, prompt_mask, responses, response_mask)
    with _head_scores_labels(
        model, layout.labels, temperature, chunk_size, stats, positions=layout.predictor
    ):
        values = model(
            input_ids=layout.input_ids,
            position_ids=layout.position_ids,
            # No padding in the row: transformers builds no mask; the layout is the mask.
            attention_mask=torch.ones_like(layout.input_ids),
            shared_prefix=layout,
            use_cache=False,
        ).logits[0]
    out = values.new_zeros(*responses.shape, values.shape[-1])
    out = out.index_put((layout.target_rows, layout.target_cols), values)
    return _split_stats(out, stats)


def padded_log_probs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    stats: Sequence[str | TokenStatistic] = ("log_prob",),
) -> TokenLogProbs:
    """The same result as :func:`packed_log_probs`, computed on the padded batch (pads cost compute).

    For models or attention kernels without packed-sequence support, and as the reference for packing.
    """
    stats = resolve_token_statistics(stats)
    labels = torch.roll(input_ids, shifts=-1, dims=1).flatten()
    position_ids = position_ids_from_mask(attention_mask)
    with _head_scores_labels(model, labels, temperature, chunk_size, stats):
        values = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
    valid = attention_mask.bool()
    scored = valid[:, 1:] & valid[:, :-1]
    shifted = torch.where(scored.unsqueeze(-1), values[:, :-1], 0.0)
    values = torch.cat((torch.zeros_like(values[:, :1]), shifted), dim=1)
    return _split_stats(values, stats)
