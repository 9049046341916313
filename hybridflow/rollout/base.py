"""`RolloutEngine`: the interface every generation backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar

import torch

from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams

__all__ = ["RolloutEngine"]


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
    """

    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    trims_host_memory: ClassVar[bool] = True

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
