"""`HFRolloutEngine`: rollouts with a transformers model in this process; the reference and the fallback engine.

Besides token prompts, the engine decodes from input embeddings one position at a time
(`HFRolloutEngine.embedding_session`): the caller chooses each next input vector itself (a soft mixture
of token embeddings, say), and the session keeps the KV cache between positions.

Multi-turn episodes continue through `HFRolloutEngine.continue_token_lists`, which keeps each sample's
KV cache after the call (up to ``kept_cache_bytes``) and, when a later prefix extends a kept sequence,
prefills only the new ids.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from hybridflow.lora import LoraConfig, add_adapters
from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine, SampledTokens
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
    with ``logprobs_mode="processed_logprobs"`` (`hybridflow.rollout.logprobs`). The KV cache of a
    ``generate`` call lives only inside it; what ``release`` frees is the per-sample caches that
    `continue_token_lists` keeps for multi-turn episodes (none unless it is called).

    Args:
        model: an HF causal LM; the engine uses it in place (``update_weights`` writes into it).
        eos_token_ids: tokens that end a sample.
        pad_token_id: fills responses past their end.
        seed: base of the per-call seed stream (see ``SeedStream``).
        max_batch_rows: most sample rows decoded at once (at least one prompt's ``n``); bounds the KV
            cache and the ``[rows, vocab]`` logits held at once.
        kept_cache_bytes: most bytes of per-sample KV caches that `continue_token_lists` keeps between
            calls (oldest dropped first; 0 keeps none, so every continuation prefills its whole prefix).
        lora: add these LoRA adapters to the model (`hybridflow.lora.add_adapters`, ``B`` zero until the
            first push); `update_weights` then takes the adapter tensors alone (``takes_adapters``).
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
        kept_cache_bytes: int = 1 << 30,
        lora: LoraConfig | None = None,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token")
        if lora is not None:
            add_adapters(model, lora)
        self.takes_adapters = lora is not None
        self.model = model.eval()
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_rows = max_batch_rows
        self.kept_cache_bytes = kept_cache_bytes
        self._seeds = SeedStream(seed)
        # ids fed -> per layer (keys, values) [kv_heads, len(ids), head_dim]; see continue_token_lists.
        self._kept: OrderedDict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()
        self._kept_bytes = 0

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
        n = sampling.n
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
        return self._sample(logits, cache, mask, next_position, sampling, stop_ids, generator)

    def _sample(
        self,
        logits: torch.Tensor,
        cache: DynamicCache,
        mask: torch.Tensor,
        next_position: torch.Tensor,
        sampling: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator,
        on_finish: Callable[[torch.Tensor, torch.Tensor, DynamicCache, torch.Tensor], None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoding loop after the prefill: ``logits [rows, vocab]`` of each row's next token, the
        ``cache`` and ``mask [rows, len]`` of the ids fed so far, ``next_position [rows, 1]``.

        ``on_finish(output_rows, batch_rows, cache, mask)`` is called for the rows that end at a step,
        before they leave the batch, while ``cache`` holds every id they were fed. Returns as `_decode`.
        """
        max_new = sampling.max_new_tokens
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
            if on_finish is not None:
                finishing = ends if step < max_new - 1 else torch.ones_like(ends)
                if bool(finishing.any()):
                    on_finish(live[finishing], finishing.nonzero().squeeze(-1), cache, mask)
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
    def continue_token_lists(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[SampledTokens]:
        """`RolloutEngine.continue_token_lists`, prefilling only what the kept caches do not cover.

        After a call every sample's KV cache (its prefix and all its sampled ids but the last, which
        was never fed) is kept, keyed by those ids. A later prefix that starts with a kept sequence (an
        episode's next turn: the same ids plus the last sampled id and an observation) reuses it, and
        only its remaining ids are prefilled, so a turn's prefill grows with the new ids, not with the
        history. A reused entry is dropped (the new samples are kept instead); `update_weights` and
        `release` drop all (they hold keys and values of old weights). The samples are those of
        `generate` on the same prefixes up to floating-point rounding (the cached keys and values were
        computed in another batch); their log-probs are those of the distribution sampled from.
        """
        if not prefixes or any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("continue_token_lists needs at least one prefix and no empty prefix")
        device = self.model.device
        stop_ids = torch.tensor(
            list(dict.fromkeys(self.eos_token_ids + sampling.stop_token_ids)), device=device
        )
        generator = torch.Generator(device=device).manual_seed(self._seeds.next(sampling.seed))
        prompts_per_call = max(1, self.max_batch_rows // sampling.n)
        samples: list[SampledTokens] = []
        for start in range(0, len(prefixes), prompts_per_call):
            chunk = [list(map(int, prefix)) for prefix in prefixes[start : start + prompts_per_call]]
            samples += self._continue_chunk(chunk, sampling, stop_ids, generator)
        return samples

    def _take_kept(self, prefix: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The longest kept cache whose ids start ``prefix`` and leave at least one id of it to feed."""
        for length in sorted({len(key) for key in self._kept}, reverse=True):
            if length < len(prefix):
                entry = self._kept.pop(tuple(prefix[:length]), None)
                if entry is not None:
                    self._kept_bytes -= sum(k.nbytes + v.nbytes for k, v in entry)
                    return entry
        return None

    def _keep(self, ids: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        size = sum(k.nbytes + v.nbytes for k, v in layers)
        if size > self.kept_cache_bytes:
            return
        self._kept[ids] = layers
        self._kept_bytes += size
        while self._kept_bytes > self.kept_cache_bytes:
            _, dropped = self._kept.popitem(last=False)
            self._kept_bytes -= sum(k.nbytes + v.nbytes for k, v in dropped)

    def _continue_chunk(
        self,
        prefixes: list[list[int]],
        sampling: SamplingParams,
        stop_ids: torch.Tensor,
        generator: torch.Generator,
    ) -> list[SampledTokens]:
        """Prefill each prefix's ids past its kept cache (left-padded: ``[pad][cached][pad][new ids]``),
        then sample; returns ``len(prefixes) * n`` samples and keeps their caches."""
        device, n = self.model.device, sampling.n
        kept = [self._take_kept(prefix) for prefix in prefixes]
        cached = [0 if entry is None else entry[0][0].shape[1] for entry in kept]
        cached_width = max(cached)
        new_width = max(len(p) - c for p, c in zip(prefixes, cached, strict=True))
        rows = len(prefixes)
        new_ids = torch.full((rows, new_width), self.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros((rows, cached_width + new_width), dtype=torch.long, device=device)
        for row, (prefix, c) in enumerate(zip(prefixes, cached, strict=True)):
            fresh = prefix[c:]
            new_ids[row, new_width - len(fresh) :] = torch.tensor(fresh, device=device)
            mask[row, cached_width - c : cached_width] = 1
            mask[row, cached_width + new_width - len(fresh) :] = 1
        cache = DynamicCache()
        if cached_width > 0:
            template = next(entry for entry in kept if entry is not None)
            for layer, (keys, values) in enumerate(template):
                shape = (rows, keys.shape[0], cached_width, keys.shape[2])
                layer_keys = keys.new_zeros(shape)
                layer_values = values.new_zeros(shape)
                for row, (entry, c) in enumerate(zip(kept, cached, strict=True)):
                    if entry is not None:
                        layer_keys[row, :, cached_width - c :] = entry[layer][0]
                        layer_values[row, :, cached_width - c :] = entry[layer][1]
                cache.update(layer_keys, layer_values, layer)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)[:, cached_width:]
        out = self.model(
            input_ids=new_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        cache.batch_repeat_interleave(n)
        finished: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

        def capture(
            output_rows: torch.Tensor, batch_rows: torch.Tensor, cache: DynamicCache, mask: torch.Tensor
        ):
            for output_row, batch_row in zip(output_rows.tolist(), batch_rows.tolist(), strict=True):
                fed = mask[batch_row].bool()
                finished[output_row] = [
                    (layer.keys[batch_row][:, fed].clone(), layer.values[batch_row][:, fed].clone())
                    for layer in cache.layers
                ]

        tokens, log_probs, lengths, stopped = self._sample(
            out.logits[:, -1].repeat_interleave(n, dim=0),
            cache,
            mask.repeat_interleave(n, dim=0),
            positions[:, -1:].repeat_interleave(n, dim=0) + 1,
            sampling,
            stop_ids,
            generator,
            on_finish=capture if self.kept_cache_bytes > 0 else None,
        )
        samples = []
        columns = (tokens.tolist(), log_probs.tolist(), lengths.tolist(), stopped.tolist())
        for row, (row_tokens, row_log_probs, length, has_stop) in enumerate(zip(*columns, strict=True)):
            samples.append(
                SampledTokens(
                    tuple(row_tokens[:length]),
                    tuple(row_log_probs[:length]),
                    FINISH_STOP if has_stop else FINISH_LENGTH,
                )
            )
            if row in finished:
                self._keep(tuple(prefixes[row // n] + row_tokens[: length - 1]), finished[row])
        return samples

    @torch.no_grad()
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        # Kept caches hold keys and values of the old weights.
        self._kept.clear()
        self._kept_bytes = 0
        # state_dict() tensors share storage with the parameters, tied ones included.
        state = self.model.state_dict()
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"the model has no parameter {name!r}")
            state[name].copy_(tensor)

    def release(self) -> int:
        """Drops the caches `continue_token_lists` keeps; returns their bytes."""
        freed = self._kept_bytes
        self._kept.clear()
        self._kept_bytes = 0
        return freed

    def resume(self) -> int:
        return 0
