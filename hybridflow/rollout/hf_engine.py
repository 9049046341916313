"""`HFRolloutEngine`: rollouts with transformers ``generate``; the reference and the fallback engine."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel

from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.packing import FINISH_LENGTH, FINISH_STOP, pack_rollouts, prompt_token_lists
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.seeding import SeedStream

__all__ = ["HFRolloutEngine"]


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
