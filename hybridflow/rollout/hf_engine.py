"""`HFRolloutEngine`: rollouts with a transformers model in this process; the reference and the fallback engine.

Besides token prompts, the engine decodes from input embeddings one position at a time
(`HFRolloutEngine.embedding_session`): the caller chooses each next input vector itself (a soft mixture
of token embeddings, say), and the session keeps the KV cache between positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers import PreTrainedModel

from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.logprobs import filter_logits
from hybridflow.rollout.packing import FINISH_LENGTH, FINISH_STOP, pack_rollouts, prompt_token_lists
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.seeding import SeedStream

__all__ = ["HFEmbeddingSession", "HFRolloutEngine", "left_pad_embeds"]


def left_pad_embeds(rows: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack per-row input embeddings ``[len_i, hidden]`` into ``[rows, max_len, hidden]``, left-padded
    with zeros, and their ``attention_mask [rows, max_len]`` (int64, 1 on the given vectors)."""
    if not rows:
        raise ValueError("prompt_embeds must hold at least one row")
    if any(row.dim() != 2 or row.shape[0] < 1 for row in rows):
        shapes = [tuple(row.shape) for row in rows]
        raise ValueError(f"each row of prompt_embeds must be [len >= 1, hidden]; got shapes {shapes}")
    width = max(row.shape[0] for row in rows)
    embeds = rows[0].new_zeros(len(rows), width, rows[0].shape[1])
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=rows[0].device)
    for i, row in enumerate(rows):
        embeds[i, width - row.shape[0] :] = row
        mask[i, width - row.shape[0] :] = 1
    return embeds, mask


class HFEmbeddingSession:
    """Decoding from input embeddings, one position at a time, with a KV cache kept between positions.

    Built by `HFRolloutEngine.embedding_session`. ``log_probs [rows, vocab]`` (float32, nats) is the
    next-token distribution of every row at temperature 1 (the log-softmax of the raw logits) after the
    inputs so far; `append` feeds one more input vector per row and returns the new ``log_probs``.
    Every row advances together: a caller whose row has finished feeds it any vector (zeros) and
    ignores that row's output.
    """

    def __init__(self, model: PreTrainedModel, prompt_embeds: Sequence[torch.Tensor]) -> None:
        self._model = model
        dtype = next(model.parameters()).dtype
        embeds, self._mask = left_pad_embeds([row.to(model.device, dtype) for row in prompt_embeds])
        positions = (self._mask.cumsum(-1) - 1).clamp(min=0)
        self._next_position = positions[:, -1:] + 1
        out = model(inputs_embeds=embeds, attention_mask=self._mask, position_ids=positions, use_cache=True)
        self._cache = out.past_key_values
        self.log_probs = out.logits[:, -1].float().log_softmax(dim=-1)

    @torch.no_grad()
    def append(self, embeds: torch.Tensor) -> torch.Tensor:
        """Feed ``embeds [rows, hidden]`` as every row's next input; returns ``log_probs [rows, vocab]``."""
        rows = self._mask.shape[0]
        if embeds.dim() != 2 or embeds.shape[0] != rows:
            raise ValueError(f"append takes [rows={rows}, hidden] embeddings, got {tuple(embeds.shape)}")
        dtype = next(self._model.parameters()).dtype
        self._mask = torch.cat([self._mask, self._mask.new_ones(rows, 1)], dim=1)
        out = self._model(
            inputs_embeds=embeds.to(self._model.device, dtype)[:, None],
            attention_mask=self._mask,
            position_ids=self._next_position,
            past_key_values=self._cache,
            use_cache=True,
        )
        self._cache = out.past_key_values
        self._next_position = self._next_position + 1
        self.log_probs = out.logits[:, -1].float().log_softmax(dim=-1)
        return self.log_probs


class HFRolloutEngine(RolloutEngine):
    """Generates with the transformers model in this process, on the model's device, in its own
    decoding loop over the model's KV cache.

    Each prompt is prefilled once and its KV cache copied to its ``n`` samples (transformers
    ``generate`` would prefill every sample's copy of the prompt), and a sample that has stopped leaves
    the decoding batch. The loop samples from `filter_logits` (temperature, then top-k, then top-p),
    and reports the log-prob of each sampled token under that distribution: the quantity vLLM reports
    with ``logprobs_mode="processed_logprobs"`` (`hybridflow.rollout.logprobs`). The KV cache lives
    only inside a ``generate`` call, so ``release``/``resume`` have nothing to free.

    Args:
        model: an HF causal LM; the engine uses it in place (``update_weights`` writes into it).
        eos_token_ids: tokens that end a sample.
        pad_token_id: fills responses past their end.
        seed: base of the per-call seed stream (see ``SeedStream``).
        max_batch_rows: most sample rows decoded at once (at least one prompt's ``n``); bounds the KV
            cache and the ``[rows, vocab]`` logits held at once.
    """

    # Weights are copied in place and decoding allocates from the heap the update freed. Trimming it
    # at every switch made a 3.1M one-rank bf16 step fault 78-86k pages a second (median step
    # 1.07-1.17 s with the trims, 0.82-0.85 s without; docs/benchmarks.md).
    trims_host_memory = False

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        seed: int = 0,
        max_batch_rows: int = 256,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token")
        self.model = model.eval()
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_rows = max_batch_rows
        self._seeds = SeedStream(seed)

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        prompt_token_lists(prompts)  # validates the prompt columns and the left padding
        device = self.model.device
        stop_ids = torch.tensor(
            list(dict.fromkeys(self.eos_token_ids + sampling.stop_token_ids)), device=device
        )
        generator = torch.Generator(device=device).manual_seed(self._seeds.next(sampling.seed))
        prompts_per_call = max(1, self.max_batch_rows // sampling.n)
        responses: list[list[int]] = []
        log_probs: list[list[float]] = []
        finish_reasons: list[str] = []
        for start in range(0, len(prompts), prompts_per_call):
            rows = slice(start, start + prompts_per_call)
            tokens, token_log_probs, lengths, stopped = self._decode(
                prompts["input_ids"][rows].to(device),
                prompts["attention_mask"][rows].to(device),
                sampling,
                stop_ids,
                generator,
            )
            columns = (tokens.tolist(), token_log_probs.tolist(), lengths.tolist(), stopped.tolist())
            for row_tokens, row_log_probs, length, has_stop in zip(*columns, strict=True):
                responses.append(row_tokens[:length])
                log_probs.append(row_log_probs[:length])
                finish_reasons.append(FINISH_STOP if has_stop else FINISH_LENGTH)
        return pack_rollouts(
            prompts,
            sampling.n,
            responses,
            log_probs,
            finish_reasons,
            sampling.max_new_tokens,
            self.pad_token_id,
        )

    def _decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        sampling: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample ``sampling.n`` responses for each of the left-padded ``input_ids [prompts, prompt_len]``.

        Returns ``tokens [rows, max_new_tokens]`` (int64), their ``log_probs [rows, max_new_tokens]``
        (float32, nats), ``lengths [rows]`` (int64, the stop token included) and ``stopped [rows]``
        (bool: ended on a stop token), ``rows = prompts * n`` in the interleaved order; entries past a
        row's length are unspecified.
        """
        n, max_new = sampling.n, sampling.max_new_tokens
        positions = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)
        logits = out.logits[:, -1].repeat_interleave(n, dim=0)
        mask = attention_mask.repeat_interleave(n, dim=0)
        next_position = positions[:, -1:].repeat_interleave(n, dim=0) + 1

        rows = len(mask)
        tokens = torch.full((rows, max_new), self.pad_token_id, dtype=torch.long, device=mask.device)
        log_probs = torch.zeros(rows, max_new, device=mask.device)
        lengths = torch.full((rows,), max_new, dtype=torch.long, device=mask.device)
        stopped = torch.zeros(rows, dtype=torch.bool, device=mask.device)
        live = torch.arange(rows, device=mask.device)  # the output row of each row still decoding
        for step in range(max_new):
            filtered = filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
            if sampling.greedy:
                token = filtered.argmax(dim=-1)
            else:
                token = torch.multinomial(filtered.softmax(dim=-1), 1, generator=generator).squeeze(-1)
            tokens[live, step] = token
            log_probs[live, step] = filtered.log_softmax(dim=-1).gather(-1, token[:, None]).squeeze(-1)
            ends = torch.isin(token, stop_ids)
            stopped[live[ends]] = True
            lengths[live[ends]] = step + 1
            if step == max_new - 1 or bool(ends.all()):
                break
            if bool(ends.any()):
                # A finished sample leaves the batch, its KV cache with it.
                keep = (~ends).nonzero().squeeze(-1)
                cache.batch_select_indices(keep)
                live, token, mask, next_position = live[keep], token[keep], mask[keep], next_position[keep]
            mask = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1]
            next_position = next_position + 1
        return tokens, log_probs, lengths, stopped

    @torch.no_grad()
    def embedding_session(self, prompt_embeds: Sequence[torch.Tensor]) -> HFEmbeddingSession:
        """Start decoding from input embeddings: one ``[len_i, hidden]`` tensor per row (rows may differ
        in length; they are left-padded). See `HFEmbeddingSession`."""
        return HFEmbeddingSession(self.model, prompt_embeds)

    @torch.no_grad()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # state_dict() tensors share storage with the parameters, tied ones included.
        state = self.model.state_dict()
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"the model has no parameter {name!r}")
            state[name].copy_(tensor)

    def release(self) -> int:
        return 0

    def resume(self) -> int:
        return 0
