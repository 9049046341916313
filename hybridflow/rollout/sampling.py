"""`SamplingParams`: how a rollout engine draws responses, independent of the engine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one ``RolloutEngine.generate`` call.

    Attributes:
        n: samples per prompt; the output holds ``n`` rows per prompt, interleaved
            (prompt i's samples at rows ``i*n .. i*n+n-1``, the layout of ``Batch.repeat(n)``).
        temperature: divides the logits before sampling. ``0`` means greedy decoding; the
            log-probs reported for greedy tokens are then those of temperature 1 (``log_softmax(logits)``).
        top_p: nucleus filter; keep the smallest set of most likely tokens whose probability
            (after temperature) sums to at least ``top_p``. ``1.0`` disables it.
        top_k: keep only the ``top_k`` most likely tokens (ties at the boundary are kept). ``-1``
            disables it.
        max_new_tokens: most tokens generated per sample; also the width of the response columns.
        stop_token_ids: tokens that end a sample in addition to the engine's end-of-sequence ids. The
            stop token is part of the response (it is sampled and trained on like any other token).
        seed: makes the call reproducible: the same seed, prompts, weights and engine settings give
            the same samples. Each data-parallel engine samples with its own seed derived from this one
            (`hybridflow.rollout.seeding.data_parallel_seed`), so dp ranks draw independent samples;
            the TP ranks of one engine share it. ``None`` draws a fresh seed from the engine's own
            stream, so successive calls differ.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"sampling.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"sampling.top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None and not 0 <= self.seed < 2**31:
            raise ValueError(f"sampling.seed must be in [0, 2**31), got {self.seed}")
        # Lists from YAML configs are accepted; a tuple keeps the dataclass hashable.
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy (``temperature == 0``)."""
        return self.temperature == 0
