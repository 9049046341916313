"""Each phase against the machine's limit (`hybridflow.metrics.efficiency`): FLOP and byte counts against
torch's own FLOP counter and hand sums, and the MFU of a matmul-only workload against the measured peak."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from hybridflow.lora import LoraConfig, add_adapters, is_adapter_name
from hybridflow.metrics.efficiency import (
    MachinePeak,
    decode_bytes,
    forward_flops,
    fractions_above_peak,
    load_machine_peak,
    matmul_parameters,
    measure_machine_peak,
    phase_efficiency,
    repeated_prompts,
    save_machine_peak,
    training_flops,
)
from hybridflow.models import build_tiny_causal_lm
from hybridflow.planning import ModelShape, count_parameters
from trainer.fit import adapter_parameters

SHAPE = ModelShape(
    model_type="qwen2",
    vocab_size=50,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    tie_word_embeddings=False,
    qkv_bias=True,
    o_bias=False,
    mlp_bias=False,
    qk_norm=False,
)


def test_matmul_parameters_by_hand():
    # per layer: q 64x64, k and v 64x32 each, o 64x64, MLP 3 x 64x96; head 64x50
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 96
    assert matmul_parameters(SHAPE) == 2 * per_layer + 64 * 50


def _counted(model: torch.nn.Module, length: int, backward: bool) -> int:
    ids = torch.randint(3, 50, (1, length))
    with FlopCounterMode(display=False) as counter:
        logits = model(input_ids=ids).logits
        if backward:
            logits.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("backward", [False, True])
def test_counts_match_torchs_flop_counter_on_a_real_forward(backward):
    """Eager attention computes all ``s^2`` (query, key) pairs and masks half; the formula counts the
    ``s (s + 1) / 2`` causal ones. Everything else must match torch's count exactly."""
    model = build_tiny_causal_lm(
        vocab_size=50, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96
    )
    model.config._attn_implementation = "eager"
    length = 12
    counted = _counted(model, length, backward)
    passes = 3 if backward else 1
    full_attention = passes * 4 * SHAPE.num_layers * SHAPE.q_dim * length * length
    causal_attention = passes * 2 * SHAPE.num_layers * SHAPE.q_dim * length * (length + 1)
    ours = (training_flops if backward else forward_flops)(SHAPE, torch.tensor([length - 5]), torch.tensor([5]))
    assert ours - causal_attention == counted - full_attention


def test_lora_training_count_matches_torchs_flop_counter():
    """With LoRA the frozen base weights get no weight gradient: torch's counter sees ``4 N`` per token for
    them and ``6`` per adapter parameter, which a full-fine-tuning count (``6 N``) would overstate."""
    model = build_tiny_causal_lm(
        vocab_size=50, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=96
    )
    model.config._attn_implementation = "eager"
    add_adapters(model, LoraConfig(rank=4))
    adapters = sum(p.numel() for name, p in model.named_parameters() if is_adapter_name(name))
    assert adapters == adapter_parameters(SHAPE, LoraConfig(rank=4))  # what a run's perf/mfu_update counts
    assert adapter_parameters(SHAPE, None) == 0
    length = 12
    # Inputs that need a gradient, as a later layer's do: otherwise the first layer would skip its
    # input gradients, which no real model (whose first layer feeds the rest) can.
    embeds = model.get_input_embeddings()(torch.randint(3, 50, (1, length))).detach().requires_grad_()
    with FlopCounterMode(display=False) as counter:
        model(inputs_embeds=embeds).logits.sum().backward()
    full_attention = 3 * 4 * SHAPE.num_layers * SHAPE.q_dim * length * length
    causal_attention = 3 * 2 * SHAPE.num_layers * SHAPE.q_dim * length * (length + 1)
    ours = training_flops(SHAPE, torch.tensor([length - 5]), torch.tensor([5]), adapter_parameters=adapters)
    assert ours - causal_attention == counter.get_total_flops() - full_attention
    full = training_flops(SHAPE, torch.tensor([length - 5]), torch.tensor([5]))
    assert full - ours == 2 * matmul_parameters(SHAPE) * length - 3 * 2 * adapters * length


def test_decode_bytes_by_hand():
    # 2 rows: prompts 3 and 5 tokens, responses 2 and 4; bf16; weights read 4 steps by 1 engine.
    got = decode_bytes(SHAPE, torch.tensor([3, 5]), torch.tensor([2, 4]), "bfloat16")
    contexts = (3 + 4) + (5 + 6 + 7 + 8)  # each decoded token reads its earlier tokens' keys and values
    kv_per_token = 2 * SHAPE.num_layers * SHAPE.num_kv_heads * SHAPE.head_dim * 2
    assert got == 4 * count_parameters(SHAPE) * 2 + contexts * kv_per_token
    two_engines = decode_bytes(SHAPE, torch.tensor([3, 5]), torch.tensor([2, 4]), "bfloat16", engines=2)
    assert two_engines - got == 4 * count_parameters(SHAPE) * 2


def test_phase_efficiency_divides_each_phase_by_its_peak():
    peak = MachinePeak("test", {"float32": 1e9, "bfloat16": 4e9}, copy_bytes_per_s=1e8)
    prompts, responses = torch.tensor([3, 5, 4]), torch.tensor([2, 4, 1])
    updated = torch.tensor([True, False, True])

    def efficiency(seconds: dict[str, float], compute_dtype: str = "bfloat16", **kwargs) -> dict[str, float]:
        return phase_efficiency(
            SHAPE,
            peak,
            seconds,
            prompt_lengths=prompts,
            response_lengths=responses,
            updated_rows=updated,
            update_passes=2,
            compute_dtype=compute_dtype,
            engine_dtype="float32",
            engines=1,
            **kwargs,
        )

    out = efficiency({"update": 2.0, "log_prob": 0.5, "generation": 0.25, "reward": 9.0})
    update = training_flops(SHAPE, prompts[updated], responses[updated])
    assert out["perf/mfu_update"] == pytest.approx(2 * update / 2.0 / 4e9)
    lora = efficiency({"update": 2.0}, adapter_parameters=1000)
    update = training_flops(SHAPE, prompts[updated], responses[updated], adapter_parameters=1000)
    assert lora["perf/mfu_update"] == pytest.approx(2 * update / 2.0 / 4e9)
    assert out["perf/mfu_log_prob"] == pytest.approx(forward_flops(SHAPE, prompts, responses) / 0.5 / 4e9)
    assert out["perf/generation_bandwidth_frac"] == pytest.approx(
        decode_bytes(SHAPE, prompts, responses, "float32") / 0.25 / 1e8
    )
    assert "perf/mfu_ref" not in out  # not timed this step
    float16 = efficiency({"update": 2.0}, compute_dtype="float16")
    assert float16 == {"perf/update_flops_per_s": out["perf/update_flops_per_s"]}  # no float16 peak stored


def test_a_shared_prompt_is_counted_once():
    """Shared-prefix forwards run a group's prompt once: rows 1 and 2 repeat row 0's prompt,
    so only their responses count, and the response tokens' pairs still reach back over the prompt."""
    prompts, responses = torch.tensor([4, 4, 4, 3]), torch.tensor([2, 3, 1, 2])
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [0, 6, 7, 9]])  # left-padded
    groups = ids
    assert repeated_prompts(groups).tolist() == [False, True, True, False]
    tokens = 4 + 3 + (2 + 3 + 1 + 2)
    pairs = 4 * 5 / 2 + 3 * 4 / 2 + (2 * 4 + 3) + (3 * 4 + 6) + (1 * 4 + 1) + (2 * 3 + 3)
    expected = 2 * matmul_parameters(SHAPE) * tokens + 4 * SHAPE.num_layers * SHAPE.q_dim * pairs
    assert forward_flops(SHAPE, prompts, responses, repeated_prompts(groups)) == pytest.approx(expected, rel=1e-12)
    unshared = forward_flops(SHAPE, prompts, responses)
    lengths = (prompts + responses).double()
    full = 2 * matmul_parameters(SHAPE) * lengths.sum() + 2 * SHAPE.num_layers * SHAPE.q_dim * (lengths * (lengths + 1)).sum()
    assert unshared == pytest.approx(full.item(), rel=1e-12)


def test_peaks_are_stored_per_device(tmp_path):
    path = str(tmp_path / "peaks.json")
    first = MachinePeak("cpu A x2", {"float32": 1.0, "bfloat16": 2.0}, 3.0)
    second = MachinePeak("gpu B", {"float32": 4.0, "bfloat16": 5.0}, 6.0)
    save_machine_peak(first, path)
    save_machine_peak(second, path)
    assert load_machine_peak("cpu A x2", path) == first
    assert load_machine_peak("gpu B", path) == second
    assert load_machine_peak("unknown", path) is None
    assert load_machine_peak("cpu A x2", str(tmp_path / "missing.json")) is None
    (tmp_path / "bad.json").write_text(json.dumps({"cpu A x2": {"flops": 1}}))
    with pytest.raises(ValueError, match=r"bad\.json is not a machine-peak file"):
        load_machine_peak("cpu A x2", str(tmp_path / "bad.json"))


def test_a_matmul_only_workload_reads_near_the_measured_peak():
    """A 'model' of one layer whose every FLOP is a large matmul (sequences of one token: no attention
    pairs beyond the token itself), timed as a log-prob phase: its MFU must sit within 10% of 1."""
    tokens, hidden = 1024, 1024
    shape = dataclasses.replace(
        SHAPE,
        vocab_size=hidden,
        hidden_size=hidden,
        num_layers=1,
        num_heads=1,
        num_kv_heads=1,
        head_dim=hidden,
        intermediate_size=hidden,
    )
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=generator)
    weights = torch.randn(8, hidden, hidden, generator=generator)  # q, k, v, o, 3 MLP, head

    def workload() -> None:
        for weight in weights:
            x @ weight

    flops = forward_flops(shape, torch.ones(tokens, dtype=torch.long), torch.zeros(tokens, dtype=torch.long))
    assert flops == pytest.approx(2 * 8 * tokens * hidden * hidden, rel=1e-3)  # attention: 4 FLOPs a row
    fractions = []
    for _ in range(3):  # the machine is shared: the best of ten runs per side, up to three rounds
        peak = measure_machine_peak(matmul_size=hidden, copy_mib=16, repeats=10, dtypes=("float32",))
        workload()
        best = min(_seconds(workload) for _ in range(10))
        out = phase_efficiency(
            shape,
            peak,
            {"log_prob": best},
            prompt_lengths=torch.ones(tokens, dtype=torch.long),
            response_lengths=torch.zeros(tokens, dtype=torch.long),
            updated_rows=torch.ones(tokens, dtype=torch.bool),
            update_passes=1,
            compute_dtype="float32",
            engine_dtype="float32",
            engines=1,
        )
        fractions.append(out["perf/mfu_log_prob"])
        if abs(fractions[-1] - 1) <= 0.1:
            break
    assert abs(fractions[-1] - 1) <= 0.1, fractions


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_only_fractions_of_the_peak_above_one_are_reported():
    metrics = {
        "perf/mfu_update": 1.45,
        "perf/mfu_log_prob": 0.97,
        "perf/mfu_ref": 1.0,  # at the peak, not above it
        "perf/generation_bandwidth_frac": 1.2,
        "perf/update_flops_per_s": 8.7e10,  # a rate, not a fraction
        "actor/clip_frac": 3.0,
    }
    assert fractions_above_peak(metrics) == {"perf/generation_bandwidth_frac": 1.2, "perf/mfu_update": 1.45}
    assert fractions_above_peak({"perf/mfu_update": 0.5}) == {}
