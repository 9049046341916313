"""`RolloutEngine`: the interface every generation backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams

__all__ = ["RolloutEngine", "SampledTokens", "left_padded_prompts"]


@dataclass(frozen=True)
class SampledTokens:
    """One sample drawn after a token prefix: the exact ids the engine sampled and their log-probs.

    Attributes:
        token_ids: the sampled ids, the final stop token included when the sample stopped.
        log_probs: the log-prob (nats) of each sampled id under the distribution it was drawn from.
        finish_reason: ``"stop"`` or ``"length"``, as in ``RolloutEngine.generate``.
    """

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...]
    finish_reason: str


def left_padded_prompts(prefixes: Sequence[Sequence[int]], pad_token_id: int) -> Batch:
    """Token id lists as a prompt Batch: ``input_ids`` and ``attention_mask [len(prefixes), longest]``,
    left-padded with ``pad_token_id`` (the mask 0 on padding), as `RolloutEngine.generate` reads them."""
    width = max(len(prefix) for prefix in prefixes)
    input_ids = torch.full((len(prefixes), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        input_ids[row, width - len(prefix) :] = torch.as_tensor(list(prefix), dtype=torch.long)
        attention_mask[row, width - len(prefix) :] = 1
    return Batch({"input_ids": input_ids, "attention_mask": attention_mask})


class RolloutEngine(ABC):
    """Generates responses for prompt Batches and takes weight updates from the training layout.

    Attributes:
        eos_token_ids: tokens that end a sample (besides ``SamplingParams.stop_token_ids``).
        pad_token_id: fills the response columns past each sample's end.
        trims_host_memory: whether, on CPU, the `ReshardingManager` hands freed heap memory back to
            the operating system (glibc's ``malloc_trim``) at each layout switch. True where the engine
            holds host memory of its own that the training layout's freed memory cannot serve (vLLM:
            its weight copy, the reload's transient copies, its KV cache). False where the engine
            decodes with the training process's own tensors and allocator (the HF engine): a trim
            there only makes the next phase fault all its pages in again.
        takes_adapters: whether the engine holds LoRA adapters of its own (built with the actor's
            ``actor.lora``), so that `update_weights` takes the adapter tensors alone (names as
            `hybridflow.lora.is_adapter_name`); False: it takes full weights (merged ones for a LoRA actor).
    """

    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    trims_host_memory: ClassVar[bool] = True
    takes_adapters: bool = False

    @abstractmethod
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """Sample ``sampling.n`` responses per prompt.

        Args:
            prompts: ``input_ids [batch, prompt_len]`` left-padded and ``attention_mask
                [batch, prompt_len]``; other columns are carried along.
            sampling: how to sample.

        Returns:
            ``batch * n`` rows, interleaved (prompt i's samples at rows ``i*n .. i*n+n-1``, as
            ``prompts.repeat(n)``), with the prompt columns repeated and:

            - ``responses [batch*n, max_new_tokens]`` int64, right-padded with ``pad_token_id``;
            - ``response_mask [batch*n, max_new_tokens]`` int64, 1 on generated tokens (the final
              stop token included);
            - ``rollout_log_probs [batch*n, max_new_tokens]`` float32, the log-prob in nats of each
              sampled token under the distribution it was sampled from (see
              ``hybridflow.rollout.logprobs``), 0 on padding;
            - ``response_lengths [batch*n]`` int64;
            - non-tensor ``finish_reason``: ``"stop"`` (an end-of-sequence or stop token) or
              ``"length"`` (``max_new_tokens`` reached).
        """

    def continue_token_lists(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[SampledTokens]:
        """Continue each token prefix with ``sampling.n`` samples: the entry point of multi-turn episodes.

        A prefix is a whole episode so far (prompt, earlier sampled turns, inserted observations), as
        exact ids; nothing is re-tokenised. The prefixes are left-padded into one prompt Batch and
        passed to `generate`, so each engine continues them as it generates from prompts: vLLM with
        its prefix cache (blocks of an episode's earlier turns are served from the cache when still
        held), the HF engine by prefilling the prefix.

        Args:
            prefixes: one non-empty id list per episode.
            sampling: how to sample; every prefix gets ``sampling.max_new_tokens`` at most.

        Returns:
            ``len(prefixes) * sampling.n`` samples, prefix-major (prefix i's at ``i*n .. i*n+n-1``).
        """
        if not prefixes or any(len(prefix) == 0 for prefix in prefixes):
            raise ValueError("continue_token_lists needs at least one prefix and no empty prefix")
        out = self.generate(left_padded_prompts(prefixes, self.pad_token_id), sampling)
        columns = (
            out["responses"].tolist(),
            out["rollout_log_probs"].tolist(),
            out["response_lengths"].tolist(),
            out["finish_reason"],
        )
        return [
            SampledTokens(tuple(ids[:length]), tuple(log_probs[:length]), str(reason))
            for ids, log_probs, length, reason in zip(*columns, strict=True)
        ]

    @abstractmethod
    def update_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with ``(hf_parameter_name, full_tensor)`` pairs.

        ``weights`` is consumed lazily, one tensor at a time, so a caller can stream buckets from a
        generator and free each after it is consumed. One call is one complete update: every weight
        of a fused engine layer (q/k/v, gate/up) must arrive in the same call.
        """

    @abstractmethod
    def release(self) -> int:
        """Free the memory the engine holds between generations (KV cache; weights where possible).

        Returns:
            bytes freed (0 if already released or nothing to free).
        """

    @abstractmethod
    def resume(self) -> int:
        """Restore what ``release`` freed so ``generate`` works again.

        Returns:
            bytes restored (0 if not released).
        """
