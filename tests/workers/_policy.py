"""Tiny policies and hand-made training batches shared by the worker tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, Qwen2Config, Qwen2ForSequenceClassification

from hybridflow.controller import ResourcePool, RoleSpec, create_colocated_worker_groups
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.resharding.manager import ReshardingConfig
from hybridflow.rollout.config import EngineDerived, RolloutConfig
from workers.actor import ActorRolloutRefWorker
from workers.config import ActorConfig, ActorDerived, RefConfig
from workers.objective import PolicyObjective

ALPHABET = "0123456789+-*=()abcdefghij"
CACHE_DIR = Path(__file__).resolve().parents[2] / ".cache"


def write_policy(path: Path, **sizes: int) -> Path:
    """A random Qwen2 over a character vocabulary, saved with its tokenizer."""
    tokenizer = build_char_tokenizer(ALPHABET)
    return save_model_dir(build_tiny_causal_lm(len(tokenizer), **sizes), tokenizer, path)


def policy_bytes(path: Path) -> int:
    from hybridflow.models.io import load_causal_lm

    return sum(p.numel() * p.element_size() for p in load_causal_lm(path).parameters())


def training_batch(rows: int, seed: int, prompt_len: int = 6, response_len: int = 10, vocab: int = 30) -> Batch:
    """Left-padded prompts, right-padded responses of varied lengths, advantages and old log-probs."""
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(2, prompt_len + 1, (rows,), generator=generator)
    response_lengths = torch.randint(1, response_len + 1, (rows,), generator=generator)
    positions = torch.arange(prompt_len)
    attention_mask = (positions >= prompt_len - prompt_lengths[:, None]).long()
    response_mask = (torch.arange(response_len) < response_lengths[:, None]).long()
    input_ids = torch.randint(4, vocab, (rows, prompt_len), generator=generator) * attention_mask
    responses = torch.randint(4, vocab, (rows, response_len), generator=generator) * response_mask
    advantages = torch.randn(rows, generator=generator)[:, None] * response_mask
    # Old log-probs near typical values of a random 30-token model, so some ratios clip.
    old_log_probs = (-3.4 + 0.3 * torch.randn(rows, response_len, generator=generator)) * response_mask
    return Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "responses": responses,
            "response_mask": response_mask,
            "advantages": advantages,
            "old_log_probs": old_log_probs,
        }
    )


ADAM = ActorConfig(lr=1e-3, grad_clip=1.0, param_dtype="float32")
"""The worker tests' actor section: AdamW at lr 1e-3, gradients clipped at norm 1, fp32 compute."""

ENGINE = EngineDerived(max_model_len=128)
"""The engine's length in the worker tests (fp32, 128 tokens of prompt + response)."""


def adam_actor(**settings) -> ActorConfig:
    """`ADAM` with ``settings`` (actor keys) changed."""
    return dataclasses.replace(ADAM, **settings)


def actor_args(
    model_dir: Path,
    actor: ActorConfig,
    rollout: RolloutConfig | None = None,
    resharding: ReshardingConfig | None = None,
    *,
    ref: RefConfig | None = None,
    objective: PolicyObjective | None = None,
    with_ref: bool = True,
) -> tuple:
    """The constructor arguments of an `ActorRolloutRefWorker` on the policy in ``model_dir``; the
    default loss is ``actor``'s own unless ``objective`` is given."""
    derived = ActorDerived(
        model_path=str(model_dir),
        objective=objective if objective is not None else actor.objective(),
        with_ref=with_ref,
        engine=ENGINE,
    )
    return (
        actor,
        ref or RefConfig(),
        rollout or RolloutConfig(engine="hf"),
        resharding or ReshardingConfig(bucket_bytes=1 << 16),
        derived,
    )


def actor_group(
    model_dir: Path,
    world_size: int,
    actor: ActorConfig,
    rollout: RolloutConfig | None = None,
    resharding: ReshardingConfig | None = None,
    name: str = "actor",
    *,
    ref: RefConfig | None = None,
    objective: PolicyObjective | None = None,
):
    """A started `ActorRolloutRefWorker` group on ``world_size`` CPU slots, and its pool."""
    pool = ResourcePool([world_size], cpus_per_slot=0.5, name=name)
    args = actor_args(model_dir, actor, rollout, resharding, ref=ref, objective=objective)
    spec = RoleSpec(ActorRolloutRefWorker, args)
    group = create_colocated_worker_groups(pool, {"actor": spec}, name=name)["actor"]
    group.init_model()
    return group, pool


def vllm_rollout(tp: int, **overrides) -> RolloutConfig:
    """The vLLM engine at ``tp`` with a 32 MB KV cache, eager unless ``overrides`` say otherwise: the worker
    tests check which weights and memory the engine holds, and vLLM's compile only slows each start
    (20-40 s a group, even with its cache filled)."""
    settings = {"enforce_eager": True, **overrides}
    return RolloutConfig(engine="vllm", tp_size=tp, cache_dir=str(CACHE_DIR), kv_cache_bytes=32 << 20, **settings)


def write_reward_model(
    path: Path, tokenizer: PreTrainedTokenizerBase | None = None, *, num_labels: int = 1
) -> Path:
    """A random Qwen2 sequence classifier (seed 11) over ``tokenizer``'s vocabulary (default: the
    character tokenizer), saved with it under ``path``.

    ``initializer_range`` 0.2 spreads the scores of different rows apart (the default gives ~1e-2).
    """
    tokenizer = tokenizer or build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        initializer_range=0.2,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        model = Qwen2ForSequenceClassification(config)
    return save_model_dir(model, tokenizer, path)
