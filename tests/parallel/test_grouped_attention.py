"""The explicit grouped-head attention equals SDPA's, values and gradients, and carries the bf16 CPU
paths of shared-prefix training and masked decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridflow.parallel import padded_log_probs, shared_prefix_log_probs
from hybridflow.parallel.grouped_attention import grouped_masked_attention, prefers_explicit_attention
from hybridflow.parallel.varlen_attention import varlen_sdpa_attention
from tests.parallel._helpers import VOCAB, tiny_qwen2


def _inputs(q_len: int, kv_len: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, dim = 3, 6, 2, 8
    query = torch.randn(batch, heads, q_len, dim, generator=generator)
    key = torch.randn(batch, kv_heads, kv_len, dim, generator=generator)
    value = torch.randn(batch, kv_heads, kv_len, dim, generator=generator)
    # Left padding of 0, 1 and 2 keys, causal over the last q_len positions.
    valid = torch.arange(kv_len) >= torch.tensor([0, 1, 2])[:, None]
    causal = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - q_len, kv_len)[:, None]
    mask = (valid[:, None, :] & causal[None])[:, None]  # [batch, 1, q_len, kv_len]
    return query, key, value, mask


def _with_grads(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    (out * weights).sum().backward()
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("q_len", [1, 4])
@pytest.mark.parametrize("additive", [False, True], ids=["bool_mask", "float_mask"])
def test_grouped_masked_attention_equals_sdpa_with_gradients(q_len, additive):
    query, key, value, mask = _inputs(q_len, kv_len=7)
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    ours, ours_grads = _with_grads(
        lambda q, k, v: grouped_masked_attention(q, k, v, mask, 0.3), query, key, value
    )
    reference, reference_grads = _with_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True),
        query,
        key,
        value,
    )
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
    for name, got, want in zip("qkv", ours_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)
    # Query head h reads key head h // 3: giving the heads to the other key head changes the output.
    swapped = grouped_masked_attention(query, key.flip(1), value.flip(1), mask, 0.3)
    assert (swapped - reference).abs().max() > 1e-2


@pytest.mark.parametrize("q_len", [1, 3])
def test_grouped_attention_without_a_mask_lets_every_query_see_every_key(q_len):
    query, key, value, _ = _inputs(q_len, kv_len=7)
    ours, ours_grads = _with_grads(lambda q, k, v: grouped_masked_attention(q, k, v, None, None), query, key, value)
    reference, reference_grads = _with_grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), query, key, value
    )
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=1e-5)
    for name, got, want in zip("qkv", ours_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4, msg=name)


def test_an_unmasked_bf16_decoding_step_takes_the_explicit_attention():
    """Rows of one prompt length decode without a mask; in bf16 the step is the explicit attention's
    (bit for bit) and follows SDPA's to bf16 rounding. Prefill (several queries) stays on SDPA."""
    module = torch.nn.Module()
    module.num_key_value_groups = 3  # transformers' sdpa reads it on the prefill's path
    query, key, value, _ = _inputs(q_len=1, kv_len=9)
    query, key, value = query.bfloat16(), key.bfloat16(), value.bfloat16()
    out, _ = varlen_sdpa_attention(module, query, key, value, None)
    explicit = grouped_masked_attention(query, key, value, None, None).transpose(1, 2)
    torch.testing.assert_close(out, explicit, atol=0, rtol=0)
    reference = F.scaled_dot_product_attention(query.float(), key.float(), value.float(), enable_gqa=True)
    torch.testing.assert_close(out.float(), reference.transpose(1, 2), atol=3e-2, rtol=0)
    prefill_query, prefill_key, prefill_value, _ = _inputs(q_len=4, kv_len=4)
    prefill, _ = varlen_sdpa_attention(
        module, prefill_query.bfloat16(), prefill_key.bfloat16(), prefill_value.bfloat16(), None
    )
    causal = F.scaled_dot_product_attention(prefill_query, prefill_key, prefill_value, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(prefill.float(), causal.transpose(1, 2), atol=3e-2, rtol=0)


def test_grouped_masked_attention_in_bf16_follows_fp32_and_stays_finite_on_empty_rows():
    query, key, value, mask = _inputs(q_len=3, kv_len=5)
    mask[0, 0, 0] = False  # a query that sees nothing, as a padding query does
    reference = grouped_masked_attention(query, key, value, mask, None)
    low = grouped_masked_attention(query.bfloat16(), key.bfloat16(), value.bfloat16(), mask, None)
    assert low.dtype == torch.bfloat16
    assert torch.isfinite(low).all() and torch.isfinite(reference).all()
    torch.testing.assert_close(low.float(), reference, atol=4e-2, rtol=0)
    # The default scale is head_dim ** -0.5, as in SDPA.
    torch.testing.assert_close(
        grouped_masked_attention(query, key, value, mask, 8**-0.5), reference, atol=0, rtol=0
    )


def test_explicit_attention_is_chosen_for_reduced_precision_on_cpu_only():
    assert prefers_explicit_attention(torch.zeros(1, dtype=torch.bfloat16), 0.0)
    assert prefers_explicit_attention(torch.zeros(1, dtype=torch.float16), 0.0)
    assert not prefers_explicit_attention(torch.zeros(1), 0.0)
    assert not prefers_explicit_attention(torch.zeros(1, dtype=torch.bfloat16), 0.1)


def test_shared_prefix_forward_in_bf16_equals_the_padded_forward():
    """A bf16 model goes through the explicit attention in every shared-prefix bucket; its log-probs
    and gradients follow the padded forward of the same bf16 model (SDPA's kernel) to bf16 rounding."""
    model = tiny_qwen2().to(torch.bfloat16)
    generator = torch.Generator().manual_seed(2)
    prompt_ids = torch.tensor([[5, 6, 7], [5, 6, 7], [VOCAB - 1, 8, 9], [VOCAB - 1, 8, 9]])
    prompt_mask = (prompt_ids != VOCAB - 1).long()
    responses = torch.randint(0, VOCAB - 1, (4, 5), generator=generator)
    response_mask = (torch.arange(5) < torch.tensor([5, 2, 4, 1])[:, None]).long()
    weights = torch.randn(4, 5, generator=generator)

    def grads(log_probs):
        model.zero_grad()
        (log_probs.float() * response_mask * weights).sum().backward()
        return {name: p.grad.float().clone() for name, p in model.named_parameters()}

    shared = shared_prefix_log_probs(model, prompt_ids, prompt_mask, responses, response_mask).log_probs
    shared_grads = grads(shared)
    model.set_attn_implementation("sdpa")
    joined_ids = torch.cat([prompt_ids, responses], dim=1)
    joined_mask = torch.cat([prompt_mask, response_mask], dim=1)
    padded = padded_log_probs(model, joined_ids, joined_mask).response(5).log_probs
    padded_grads = grads(padded)
    torch.testing.assert_close(shared.float(), padded.float() * response_mask, atol=5e-2, rtol=0)
    for name, grad in padded_grads.items():
        scale = grad.abs().max().clamp(min=1e-3)
        assert (shared_grads[name] - grad).abs().max() <= 0.1 * scale, name
