"""The latent rollout: a latent phase of soft input embeddings, then explicit sampling, on any engine that
decodes from input embeddings (``engine.embedding_session``: the HF engine, or vLLM with
``enable_prompt_embeds``).

Each response position is one of three kinds, decided row by row:

- **latent** (while the row is in its latent phase and the top id of ``g`` is not end-of-thinking): the
  step's top-``K`` ids and their ``g`` are stored; the next input is their soft embedding; the
  position's ``responses`` id is the top id (so a decoded response reads like the chain it superposes)
  and its log-prob is `latent_log_density`;
- **end of thinking** (the top id of ``g`` is end-of-thinking): the token is emitted as an explicit
  token, and the row samples explicitly from the next position on;
- **explicit**: a token drawn from ``softmax(logp / temperature)`` (greedy at temperature 0), fed back as
  its own embedding, until a stop token or ``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from hybridflow.protocol import Batch
from hybridflow.rollout.packing import FINISH_LENGTH, FINISH_STOP, pack_rollouts
from hybridflow.rollout.sampling import SamplingParams
from recipes.latent_grpo.latent import (
    LatentSampling,
    latent_candidates,
    latent_log_density,
    one_sided_gumbel,
    soft_embeddings,
)

__all__ = ["LATENT_COLUMNS", "LatentRolloutRecord", "latent_rollout"]

LATENT_COLUMNS = ("latent_ids", "latent_g", "latent_mask")
"""What a latent rollout stores besides the usual rollout columns: ``latent_ids [batch, response_len, K]``
(int64), ``latent_g [batch, response_len, K]`` (float32) and ``latent_mask [batch, response_len]`` (int64, 1
at latent positions; the other positions hold zeros in the first two)."""


@dataclass
class LatentRolloutRecord:
    """What the rollout fed the engine, for inspection: ``inputs[t] [rows, hidden]`` is every row's input
    after response position ``t`` (zeros for a finished row)."""

    inputs: list[torch.Tensor]


def _explicit_tokens(
    log_probs: torch.Tensor, temperature: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled ids ``[rows]`` and their log-probs under the distribution they were drawn from (at
    temperature 1 for greedy, as the engines report them)."""
    if temperature == 0:
        ids = log_probs.argmax(dim=-1)
        return ids, log_probs.gather(-1, ids[:, None]).squeeze(-1)
    tempered = (log_probs / temperature).log_softmax(dim=-1)
    ids = torch.multinomial(tempered.exp().cpu(), 1, generator=generator).squeeze(-1).to(log_probs.device)
    return ids, tempered.gather(-1, ids[:, None]).squeeze(-1)


@torch.no_grad()
def latent_rollout(
    start_session: Callable[[Sequence[torch.Tensor]], object],
    embedding: torch.Tensor,
    prompts: Batch,
    sampling: SamplingParams,
    latent: LatentSampling,
    stop_token_ids: Sequence[int],
    pad_token_id: int,
    generator: torch.Generator,
    record: LatentRolloutRecord | None = None,
) -> Batch:
    """Sample ``sampling.n`` latent-then-explicit responses per prompt.

    Args:
        start_session: ``engine.embedding_session``: takes one ``[len_i, hidden]`` tensor per row and
            returns a session with ``log_probs [rows, vocab]`` and ``append(embeds [rows, hidden])``.
        embedding: ``[vocab, hidden]`` the policy's input embedding matrix (the engine's weights).
        prompts: ``input_ids``/``attention_mask [batch, prompt_len]``, left-padded.
        sampling: ``n``, ``max_new_tokens`` and the explicit phase's ``temperature`` (0: greedy; the latent
            noise is then off too).
        latent: the latent step's ``K``, ``tau``, noise scale and end-of-thinking id.
        stop_token_ids: tokens that end a response in the explicit phase.
        pad_token_id: fills the response columns past each row's end.
        generator: the CPU generator every random draw comes from.
        record: filled with the inputs fed to the engine, when given.

    Returns:
        The rollout columns of `hybridflow.rollout.RolloutEngine.generate` (``n`` interleaved rows per
        prompt) plus `LATENT_COLUMNS`. A row that reaches ``max_new_tokens`` has finish reason ``length``.
    """
    if sampling.top_p != 1.0 or sampling.top_k != -1:
        raise ValueError(
            f"the latent rollout samples its explicit tokens at a temperature only; got top_p={sampling.top_p}, "
            f"top_k={sampling.top_k} (set rollout.top_p: 1.0 and rollout.top_k: -1)"
        )
    n, width, k = sampling.n, sampling.max_new_tokens, latent.top_k
    input_ids = prompts["input_ids"].repeat_interleave(n, dim=0)
    attention_mask = prompts["attention_mask"].repeat_interleave(n, dim=0).bool()
    rows = len(input_ids)
    session = start_session([embedding[ids[mask]] for ids, mask in zip(input_ids, attention_mask, strict=True)])
    noise_scale = 0.0 if sampling.greedy else latent.noise_scale
    stops = torch.tensor(sorted(set(stop_token_ids)), dtype=torch.long)

    tokens = torch.full((rows, width), pad_token_id, dtype=torch.long)
    log_probs_out = torch.zeros(rows, width)
    latent_ids = torch.zeros(rows, width, k, dtype=torch.long)
    latent_g = torch.zeros(rows, width, k)
    latent_mask = torch.zeros(rows, width, dtype=torch.long)
    thinking = torch.ones(rows, dtype=torch.bool)
    running = torch.ones(rows, dtype=torch.bool)
    lengths = torch.full((rows,), width, dtype=torch.long)
    stopped = torch.zeros(rows, dtype=torch.bool)
    for t in range(width):
        log_probs = session.log_probs.float().cpu()
        noise = one_sided_gumbel(tuple(log_probs.shape), noise_scale, generator)
        ids, g = latent_candidates(log_probs, noise, k)
        is_latent = running & thinking & (ids[:, 0] != latent.end_of_thinking_id)
        ends_thinking = running & thinking & ~is_latent
        explicit_ids, explicit_log_probs = _explicit_tokens(log_probs, sampling.temperature, generator)
        eot = torch.full_like(explicit_ids, latent.end_of_thinking_id)
        eot_log_probs = _explicit_tokens_log_prob(log_probs, eot, sampling.temperature)
        step_ids = torch.where(is_latent, ids[:, 0], torch.where(ends_thinking, eot, explicit_ids))
        density = latent_log_density(log_probs.gather(-1, ids), g)
        step_log_probs = torch.where(is_latent, density, torch.where(ends_thinking, eot_log_probs, explicit_log_probs))

        tokens[running, t] = step_ids[running]
        log_probs_out[running, t] = step_log_probs[running]
        latent_ids[is_latent, t] = ids[is_latent]
        latent_g[is_latent, t] = g[is_latent]
        latent_mask[is_latent, t] = 1

        next_inputs = torch.where(
            is_latent[:, None], soft_embeddings(ids, g, latent.tau, embedding), embedding[step_ids]
        )
        finished = running & ~thinking & torch.isin(step_ids, stops)
        lengths[finished] = t + 1
        stopped |= finished
        thinking &= ~ends_thinking
        running &= ~finished
        next_inputs[~running] = 0
        if record is not None:
            record.inputs.append(next_inputs.clone())
        if not running.any() or t == width - 1:
            break
        session.append(next_inputs)

    responses = [tokens[i, : lengths[i]].tolist() for i in range(rows)]
    log_prob_lists = [log_probs_out[i, : lengths[i]].tolist() for i in range(rows)]
    finish = [FINISH_STOP if s else FINISH_LENGTH for s in stopped.tolist()]
    packed = pack_rollouts(prompts, n, responses, log_prob_lists, finish, width, pad_token_id)
    return packed | Batch({"latent_ids": latent_ids, "latent_g": latent_g, "latent_mask": latent_mask})


def _explicit_tokens_log_prob(log_probs: torch.Tensor, ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs ``[rows]`` of ``ids`` under ``softmax(logp / temperature)`` (temperature 1 for greedy)."""
    tempered = log_probs if temperature == 0 else (log_probs / temperature).log_softmax(dim=-1)
    return tempered.gather(-1, ids[:, None]).squeeze(-1)
