"""A LoRA actor on 2 ranks (Ray, gloo, FSDP2) with the HF engine: the adapters at initialisation change
nothing, an update moves the adapters alone, the reference is the base model, the weight push carries
the adapters alone (or merged weights), a checkpoint resumes exactly and the export loads in PEFT and
transformers with the same greedy tokens.

One group pushes adapters to an engine that holds them; a second pushes merged weights to a plain engine.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from peft import PeftModel
from torch.distributed.checkpoint import FileSystemReader

from hybridflow.lora import LoraConfig, is_adapter_name
from hybridflow.models.io import load_causal_lm
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from tests.workers._policy import actor_group, adam_actor, training_batch, write_policy
from workers.actor import sequence_log_probs

# Rank 3: each A [3, in] is sharded unevenly over the 2 ranks, as the packed adapter gather must handle.
LORA = LoraConfig(rank=3, alpha=6.0, target_modules=("q_proj", "v_proj", "up_proj", "down_proj"), seed=3)
SAMPLING = SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=5)
ROWS = 8


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return write_policy(tmp_path_factory.mktemp("lora_policy"), seed=4)


def actor(push: str):
    return adam_actor(
        lr=2e-2,
        grad_clip=None,
        ppo_mini_batch_size=ROWS,
        ppo_micro_batch_size=2,
        lora=dataclasses.replace(LORA, push=push),
        use_kl_loss=True,
        kl_loss_coef=0.1,
    )


def prompts(n: int = ROWS // SAMPLING.n) -> Batch:
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 7, (n,), generator=generator)
    mask = (torch.arange(6) >= 6 - lengths[:, None]).long()
    return Batch({"input_ids": torch.randint(4, 26, (n, 6), generator=generator) * mask, "attention_mask": mask})


def engine_gap(rollouts: Batch, log_probs: torch.Tensor) -> float:
    mask = rollouts["response_mask"].bool()
    return (rollouts["rollout_log_probs"] - log_probs).abs()[mask].max().item()


def adapter_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for name, t in state.items() if is_adapter_name(name))


@pytest.fixture(scope="module")
def adapters_run(ray_cluster, policy_dir, tmp_path_factory):
    """Everything the adapter-pushing group does, recorded once."""
    group, pool = actor_group(policy_dir, 2, actor("adapters"), name="lora-adapters")
    out: dict[str, object] = {}
    try:
        batch = training_batch(ROWS, seed=1, vocab=26)
        with_ref = batch | group.compute_ref_log_prob(batch, temperature=1.0)
        out["batch"] = batch
        out["init_lp"] = group.compute_log_prob(batch, temperature=1.0)["old_log_probs"]
        out["init_ref"] = with_ref["ref_log_probs"]
        out["init_state"] = group.gather_full_state()[0]
        out["update_1"] = group.update_actor(with_ref, temperature=1.0)
        out["state_1"] = group.gather_full_state()[0]
        out["ref_1"] = group.compute_ref_log_prob(batch, temperature=1.0)["ref_log_probs"]
        rollouts = group.generate_sequences(prompts(), SAMPLING)
        out["rollouts"] = rollouts
        out["rollouts_lp"] = group.compute_log_prob(rollouts, temperature=1.0)["old_log_probs"]
        out["rollouts_ref"] = group.compute_ref_log_prob(rollouts, temperature=1.0)["ref_log_probs"]
        checkpoint = tmp_path_factory.mktemp("lora_ckpt")
        group.save_checkpoint(str(checkpoint), export_hf=True)
        out["checkpoint"] = checkpoint
        out["update_2"] = group.update_actor(with_ref, temperature=1.0)
        out["lp_2"] = group.compute_log_prob(batch, temperature=1.0)["old_log_probs"]
        group.load_checkpoint(str(checkpoint))
        out["resumed_update_2"] = group.update_actor(with_ref, temperature=1.0)
        out["resumed_lp_2"] = group.compute_log_prob(batch, temperature=1.0)["old_log_probs"]
        yield out
    finally:
        group.hosts.shutdown()
        pool.release()


def test_adapters_at_init_leave_the_log_probs_of_the_base_model(adapters_run, policy_dir):
    # B = 0: adapters on (actor) and adapters off (reference) give the same numbers, bit for bit.
    assert torch.equal(adapters_run["init_lp"], adapters_run["init_ref"])
    base = load_causal_lm(policy_dir, torch.float32)
    with torch.no_grad():
        expected = sequence_log_probs(
            base, adapters_run["batch"], temperature=1.0, use_packing=False, chunk_size=None
        ).log_probs
    mask = adapters_run["batch"]["response_mask"].bool()
    assert (adapters_run["init_ref"] - expected).abs()[mask].max().item() < 1e-6
    # After the update the reference is still the base model: the adapters are off in its forward.
    assert (adapters_run["ref_1"] - expected).abs()[mask].max().item() < 1e-6


def test_an_update_changes_the_adapters_alone(adapters_run):
    before, after = adapters_run["init_state"], adapters_run["state_1"]
    assert before.keys() == after.keys()
    adapters = [name for name in before if is_adapter_name(name)]
    base = [name for name in before if not is_adapter_name(name)]
    assert len(adapters) == 2 * 2 * len(LORA.target_modules)  # A and B of each target in 2 layers
    assert all(torch.equal(before[name], after[name]) for name in base)
    assert all(not before[name].any() for name in adapters if ".lora_B." in name)
    assert all(after[name].abs().max() > 1e-3 for name in adapters if ".lora_B." in name)


def test_the_adapter_push_reaches_the_engine(adapters_run):
    rollouts = adapters_run["rollouts"]
    metrics = rollouts.meta["rollout_metrics"]
    assert metrics["resharding/lora_push_merged"] == 0.0
    # Only the adapter tensors were pushed: their bytes exactly, not the model's.
    assert metrics["resharding/to_inference_streamed_mb"] * 2**20 == adapter_bytes(adapters_run["state_1"])
    assert engine_gap(rollouts, adapters_run["rollouts_lp"]) < 1e-4
    # A stale engine (adapters of the initial policy, i.e. the base model) would show in the sync gap.
    assert engine_gap(rollouts, adapters_run["rollouts_ref"]) > 0.05


def test_a_lora_checkpoint_holds_the_adapters_and_resumes_exactly(adapters_run):
    metadata = FileSystemReader(str(adapters_run["checkpoint"] / "actor_dcp")).read_metadata()
    keys = [key for key in metadata.state_dict_metadata if key.startswith(("model.", "optim.state."))]
    assert keys and all(is_adapter_name(key) for key in keys)
    # All but the process's memory high-water mark (the same processes, later: it can only have grown).
    for resumed, uninterrupted in zip(adapters_run["resumed_update_2"], adapters_run["update_2"], strict=True):
        resumed, uninterrupted = dict(resumed), dict(uninterrupted)
        assert resumed.pop("memory/actor_process_peak_mb") >= uninterrupted.pop("memory/actor_process_peak_mb")
        assert resumed == uninterrupted
    assert torch.equal(adapters_run["resumed_lp_2"], adapters_run["lp_2"])


def test_the_merged_export_decodes_as_the_adapter_model(adapters_run, policy_dir):
    checkpoint = adapters_run["checkpoint"]
    merged = load_causal_lm(checkpoint / "hf", torch.float32).eval()
    adapted = PeftModel.from_pretrained(load_causal_lm(policy_dir, torch.float32), checkpoint / "adapter").eval()
    base = load_causal_lm(policy_dir, torch.float32).eval()
    ids = prompts()["input_ids"][:, -4:].clamp(min=4)
    settings = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        tokens = merged.generate(ids, **settings)
        assert torch.equal(tokens, adapted.generate(input_ids=ids, **settings))
        # The adapters are not a no-op: the base model decodes otherwise.
        assert not torch.equal(tokens, base.generate(ids, **settings))


def test_a_plain_engine_gets_merged_weights(ray_cluster, policy_dir):
    group, pool = actor_group(policy_dir, 2, actor("merged"), name="lora-merged")
    try:
        batch = training_batch(ROWS, seed=1, vocab=26)
        with_ref = batch | group.compute_ref_log_prob(batch, temperature=1.0)
        group.update_actor(with_ref, temperature=1.0)
        rollouts = group.generate_sequences(prompts(), SAMPLING)
        trained = group.compute_log_prob(rollouts, temperature=1.0)["old_log_probs"]
        reference = group.compute_ref_log_prob(rollouts, temperature=1.0)["ref_log_probs"]
        full = group.gather_full_state()[0]
    finally:
        group.hosts.shutdown()
        pool.release()
    metrics = rollouts.meta["rollout_metrics"]
    assert metrics["resharding/lora_push_merged"] == 1.0
    # The base model's bytes: every weight once, merged, and no adapter tensor.
    base_bytes = sum(t.numel() * t.element_size() for name, t in full.items() if not is_adapter_name(name))
    assert metrics["resharding/to_inference_streamed_mb"] * 2**20 == base_bytes
    assert engine_gap(rollouts, trained) < 1e-4
    assert engine_gap(rollouts, reference) > 0.05


def test_the_update_reports_the_adapters_gradient_and_optimizer_memory(adapters_run):
    metrics = adapters_run["update_1"][0]
    adapters = adapter_bytes(adapters_run["state_1"])
    base = sum(t.numel() * t.element_size() for t in adapters_run["state_1"].values()) - adapters
    held = metrics["memory/actor_grad_optimizer_mb"] * 2**20
    # A gradient and AdamW's two moments per adapter weight, sharded over 2 ranks (rank 0 holds the
    # larger half of an odd split: rank 3's A has 2 of its 3 rows there), plus a step per parameter.
    assert 1.5 * adapters <= held <= 2.0 * adapters + 8 * 2 * 2 * len(LORA.target_modules)
    assert held < 0.1 * base  # the frozen base weights have neither
    # ru_maxrss is in KiB: a process holding torch and the model is hundreds of MiB, not hundreds of KiB.
    assert 100 < metrics["memory/actor_process_peak_mb"] < 100_000
