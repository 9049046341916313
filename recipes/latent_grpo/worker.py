"""`LatentActor`: the actor worker of Latent-GRPO, a subclass of the shipped `ActorRolloutRefWorker`.

What it changes:

- the rollout (`_sample`) is `latent_rollout` on the engine's embedding session, in the inference layout
  as usual (so validation, which calls ``generate_sequences``, decodes latently too, without noise when
  greedy);
- every training-layout forward (`_sequence_stats`) of a latent batch rebuilds the input embeddings
  from the stored steps and scores latent positions with the Gumbel log-density;
- the input embedding matrix is frozen: the rollout and the training forward both read one full copy of
  it, gathered once after the model is built.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from hybridflow.controller import register
from hybridflow.parallel import TokenLogProbs, TokenStatistic
from hybridflow.protocol import Batch
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.config import RolloutConfig
from hybridflow.rollout.sampling import SamplingParams
from hybridflow.rollout.seeding import SeedStream, data_parallel_rank
from recipes.latent_grpo.forward import latent_sequence_log_probs
from recipes.latent_grpo.latent import LatentSampling
from recipes.latent_grpo.rollout import latent_rollout
from workers.actor import ActorRolloutRefWorker

__all__ = ["LatentActor"]


class LatentActor(ActorRolloutRefWorker):
    """`ActorRolloutRefWorker` with latent rollouts and latent log-probs; the same constructor arguments.

    A vLLM rollout is built with ``enable_prompt_embeds``. `set_latent_sampling` gives the latent
    step's settings (before the first rollout; the defaults are `LatentSampling`'s, with
    end-of-thinking id 0).
    """

    def __init__(self, actor, ref, rollout: RolloutConfig, resharding, derived) -> None:
        if rollout.engine == "vllm":
            rollout = dataclasses.replace(rollout, enable_prompt_embeds=True)
        super().__init__(actor, ref, rollout, resharding, derived)
        self.latent = LatentSampling()
        self._latent_seeds = SeedStream(rollout.seed + data_parallel_rank(rollout.tp_size))

    @register(dispatch="one_to_all")
    def set_latent_sampling(self, latent: LatentSampling) -> None:
        """Use ``latent`` for the rollout's latent steps and to rebuild their embeddings in training."""
        self.latent = latent

    def init_model(self) -> dict[str, float]:
        metrics = super().init_model()
        weight = self.model.get_input_embeddings().weight
        # Frozen: it never reaches the forward (inputs arrive as embeddings), and AdamW skips it.
        weight.requires_grad_(False)
        full = weight.full_tensor() if hasattr(weight, "full_tensor") else weight
        self.embedding = full.detach().clone()
        return metrics

    @register(dispatch="rank_zero")
    def input_embedding(self) -> torch.Tensor:
        """The frozen ``[vocab, hidden]`` input embedding matrix the rollouts and the forwards use."""
        return self.embedding.cpu()

    def _sample(self, engine: RolloutEngine, prompts: Batch, sampling: SamplingParams) -> Batch:
        generator = torch.Generator().manual_seed(self._latent_seeds.next(sampling.seed))
        return latent_rollout(
            engine.embedding_session,
            self.embedding.cpu(),
            prompts,
            sampling,
            self.latent,
            (*engine.eos_token_ids, *sampling.stop_token_ids),
            engine.pad_token_id,
            generator,
        )

    def _sequence_stats(
        self, model: nn.Module, batch: Batch, temperature: float, stats: Sequence[str | TokenStatistic]
    ) -> TokenLogProbs:
        if "latent_mask" not in batch:
            return super()._sequence_stats(model, batch, temperature, stats)
        names = [s if isinstance(s, str) else s.name for s in stats]
        if names != ["log_prob"]:
            raise ValueError(f"a latent batch has only the log-prob statistic, not {names}")
        embedding = self.embedding.to(batch["responses"].device)
        log_probs = latent_sequence_log_probs(model, batch, embedding, self.latent.tau, temperature)
        return TokenLogProbs({"log_prob": log_probs})
