"""A LoRA actor pushing its adapters alone to vLLM's CPU build (``enable_lora``): after each push the
engine's log-probs equal the trainer's, an update reaches the engine (a stale adapter would be seen in
the sync gap), and only the adapter bytes travel."""

from __future__ import annotations

import pytest
import torch

from hybridflow.lora import LoraConfig, is_adapter_name
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from tests.workers._policy import actor_group, adam_actor, training_batch, vllm_rollout, write_policy

LORA = LoraConfig(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "gate_proj", "down_proj"), seed=3)
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=5)
ROWS = 8


def prompts(n: int = ROWS // SAMPLING.n) -> Batch:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 7, (n,), generator=generator)
    mask = (torch.arange(6) >= 6 - lengths[:, None]).long()
    return Batch({"input_ids": torch.randint(4, 26, (n, 6), generator=generator) * mask, "attention_mask": mask})


def engine_gap(rollouts: Batch, log_probs: torch.Tensor) -> float:
    mask = rollouts["response_mask"].bool()
    return (rollouts["rollout_log_probs"] - log_probs).abs()[mask].max().item()


@pytest.fixture(scope="module")
def vllm_run(ray_cluster, tmp_path_factory):
    policy_dir = write_policy(tmp_path_factory.mktemp("lora_vllm_policy"), seed=4)
    actor = adam_actor(lr=2e-2, grad_clip=None, ppo_mini_batch_size=ROWS, ppo_micro_batch_size=2, lora=LORA)
    # One rank: the 2-rank adapter gather is tested with the HF engine (test_lora_actor.py).
    group, pool = actor_group(policy_dir, 1, actor, vllm_rollout(1), name="lora-vllm")
    try:
        out: dict[str, object] = {"before": group.generate_sequences(prompts(), SAMPLING)}
        out["before_lp"] = group.compute_log_prob(out["before"], temperature=1.0)["old_log_probs"]
        group.update_actor(training_batch(ROWS, seed=1, vocab=26), temperature=1.0)
        out["after"] = group.generate_sequences(prompts(), SAMPLING)
        out["after_lp"] = group.compute_log_prob(out["after"], temperature=1.0)["old_log_probs"]
        out["after_ref"] = group.compute_ref_log_prob(out["after"], temperature=1.0)["ref_log_probs"]
        out["state"] = group.gather_full_state()[0]
        yield out
    finally:
        group.hosts.shutdown()
        pool.release()


def test_vllm_serves_the_pushed_adapters(vllm_run):
    # fp32 engine and trainer; the bound of the full-weight sync test (tests/workers/test_sync.py).
    assert engine_gap(vllm_run["before"], vllm_run["before_lp"]) < 1e-3
    assert engine_gap(vllm_run["after"], vllm_run["after_lp"]) < 1e-3
    # The base model (adapters off) is what a stale adapter would serve: far off.
    assert engine_gap(vllm_run["after"], vllm_run["after_ref"]) > 0.05


def test_only_the_adapter_bytes_are_pushed(vllm_run):
    metrics = vllm_run["after"].meta["rollout_metrics"]
    adapter_bytes = sum(t.numel() * t.element_size() for n, t in vllm_run["state"].items() if is_adapter_name(n))
    assert metrics["resharding/lora_push_merged"] == 0.0
    assert metrics["resharding/to_inference_streamed_mb"] * 2**20 == adapter_bytes
