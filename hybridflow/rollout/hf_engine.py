"""`HFRolloutEngine`: rollouts with transformers ``generate``; the reference and the fallback engine.

Besides token prompts, the engine decodes from input embeddings one position at a time
(`HFRolloutEngine.embedding_session`): the caller chooses each next input vector itself (a soft mixture
of token embeddings, say), and the session keeps the KV cache between positions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel

from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
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
    """Generates with ``model.generate`` in this process, on the model's device.

    Reported log-probs are ``log_softmax`` of ``generate``'s per-step scores, which are the logits
    after temperature, top-k and top-p (the same quantity vLLM reports with
    ``logprobs_mode="processed_logprobs"``). The KV cache lives only inside a ``generate`` call, so
    ``release``/``resume`` have nothing to free.

    Args:
        model: an HF causal LM; the engine uses it in place (``update_weights`` writes into it).
        eos_token_ids: tokens that end a sample.
        pad_token_id: fills responses past their end (and pads prompts inside ``generate``).
        seed: base of the per-call seed stream (see ``SeedStream``).
        max_batch_rows: rows generated at once; bounds the ``rows x steps x vocab`` scores kept.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        seed: int = 0,
        max_batch_rows: int = 64,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("eos_token_ids must name at least one token")
        self.model = model.eval()
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.max_batch_rows = max_batch_rows
        self._seeds = SeedStream(seed)

    def _generation_config(self, sampling: SamplingParams, stop_ids: list[int]) -> GenerationConfig:
        common = {
            "max_new_tokens": sampling.max_new_tokens,
            "eos_token_id": stop_ids,
            "pad_token_id": self.pad_token_id,
            "output_scores": True,
            "return_dict_in_generate": True,
            # Neutral values so that a checkpoint's generation_config.json cannot add processors
            # the vLLM engine would not apply.
            "repetition_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "min_length": 0,
        }
        if sampling.greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            # transformers disables top-k with 0 (its default is 50) and top-p with 1.0.
            top_k=0 if sampling.top_k == -1 else sampling.top_k,
            top_p=sampling.top_p,
            **common,
        )

    @torch.no_grad()
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        prompt_token_lists(prompts)  # validates the prompt columns and the left padding
        n = sampling.n
        device = self.model.device
        input_ids = prompts["input_ids"].repeat_interleave(n, dim=0).to(device)
        attention_mask = prompts["attention_mask"].repeat_interleave(n, dim=0).to(device)
        stop_ids = list(dict.fromkeys(self.eos_token_ids + sampling.stop_token_ids))
        config = self._generation_config(sampling, stop_ids)
        stop_tensor = torch.tensor(stop_ids, device=device)
        prompt_len = input_ids.shape[1]

        responses: list[list[int]] = []
        log_probs: list[list[float]] = []
        finish_reasons: list[str] = []
        seed = self._seeds.next(sampling.seed)
        rng_devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng_devices):
            torch.manual_seed(seed)
            for start in range(0, len(input_ids), self.max_batch_rows):
                rows = slice(start, start + self.max_batch_rows)
                out = self.model.generate(
                    input_ids=input_ids[rows], attention_mask=attention_mask[rows], generation_config=config
                )
                new_tokens = out.sequences[:, prompt_len:]
                # scores[t] [rows, vocab]: the processed logits step t sampled from.
                step_log_probs = torch.stack(
                    [
                        scores.float().log_softmax(dim=-1).gather(-1, new_tokens[:, t : t + 1]).squeeze(-1)
                        for t, scores in enumerate(out.scores)
                    ],
                    dim=1,
                )
                is_stop = torch.isin(new_tokens, stop_tensor)
                has_stop = is_stop.any(dim=1)
                # Past a sample's stop token generate writes pad ids; the sample ends at its first stop.
                lengths = torch.where(has_stop, is_stop.float().argmax(dim=1) + 1, new_tokens.shape[1])
                for row, (length, stopped) in enumerate(
                    zip(lengths.tolist(), has_stop.tolist(), strict=True)
                ):
                    responses.append(new_tokens[row, :length].tolist())
                    log_probs.append(step_log_probs[row, :length].tolist())
                    finish_reasons.append(FINISH_STOP if stopped else FINISH_LENGTH)
        return pack_rollouts(
            prompts, n, responses, log_probs, finish_reasons, sampling.max_new_tokens, self.pad_token_id
        )

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
