"""Packed forward = padded forward = each sequence run alone; chunked log-softmax = unchunked."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hybridflow.parallel import (
    VARLEN_SDPA,
    pack_sequences,
    packed_log_probs,
    padded_log_probs,
    sequence_runs,
    token_log_probs,
    unpack_tokens,
    varlen_attention,
)
from tests.parallel._helpers import VOCAB, skewed_batch, tiny_qwen2

# Very different lengths: one long, several short, a single-token row.
LENGTHS = [5, 48, 2, 1, 11, 3]
SEQ_LEN = 48


def _alone(model, input_ids, mask, temperature):
    """Reference: each row's valid tokens forwarded alone, no padding: ``[batch, seq_len]`` log-probs."""
    out = torch.zeros(input_ids.shape)
    for row in range(input_ids.shape[0]):
        valid = mask[row].bool()
        tokens = input_ids[row][valid].unsqueeze(0)
        logits = model(input_ids=tokens).logits[0].float() / temperature
        scores = torch.log_softmax(logits[:-1], -1).gather(-1, tokens[0, 1:, None])[:, 0]
        columns = valid.nonzero()[1:, 0]
        out[row, columns] = scores
    return out


def test_pack_unpack_roundtrip_and_positions():
    input_ids, mask = skewed_batch([3, 1, 4], 6, left=True)
    packed = pack_sequences(input_ids, mask)
    assert packed.input_ids.tolist() == [input_ids[mask.bool()].tolist()]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 0, 1, 2, 3]]
    assert packed.cu_seqlens.tolist() == [0, 3, 4, 8]
    assert packed.max_seqlen == 4
    restored = unpack_tokens(packed.input_ids[0], packed, fill=-1)
    assert torch.equal(restored, input_ids.masked_fill(mask == 0, -1))


@pytest.mark.parametrize("attn", [VARLEN_SDPA, "sdpa", "eager"])
@pytest.mark.parametrize("left", [True, False], ids=["left_padded", "right_padded"])
def test_packed_equals_padded_and_alone(attn, left):
    model = tiny_qwen2(attn=attn).eval()
    input_ids, mask = skewed_batch(LENGTHS, SEQ_LEN, left=left)
    with torch.no_grad():
        packed = packed_log_probs(model, input_ids, mask, temperature=0.7, stats=("log_prob", "entropy"))
        padded = padded_log_probs(model, input_ids, mask, temperature=0.7, stats=("log_prob", "entropy"))
        alone = _alone(model, input_ids, mask, temperature=0.7)
    assert packed.log_probs.shape == (len(LENGTHS), SEQ_LEN)
    torch.testing.assert_close(packed.log_probs, padded.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.entropy, padded.entropy, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.log_probs, alone, atol=1e-5, rtol=0)
    # Scored positions are exactly the valid tokens after the first of each row; pads and starts are 0.
    scored = mask.bool() & (mask.cumsum(-1) > 1)
    assert bool((packed.log_probs[scored] < 0).all())
    assert bool((packed.log_probs[~scored] == 0).all())
    # Entropy is bounded by log(vocab); a uniform-ish random model sits near it.
    assert bool((packed.entropy[scored] <= torch.log(torch.tensor(float(VOCAB))) + 1e-5).all())


def test_sequence_runs():
    offsets = [0, 3, 5, 30, 31, 33, 40]
    assert sequence_runs(offsets, 10) == [[0, 3, 5], [5, 30], [30, 31, 33, 40]]
    assert sequence_runs(offsets, 1000) == [offsets]
    assert sequence_runs(offsets, 1) == [[0, 3], [3, 5], [5, 30], [30, 31], [31, 33], [33, 40]]


@pytest.mark.parametrize("group_tokens", [1, 12, 10_000])
def test_varlen_runs_of_any_size_equal_each_sequence_alone(monkeypatch, group_tokens):
    # 1: one call per sequence; 12: masked runs of short sequences and long ones alone; 10_000: one run.
    monkeypatch.setattr(varlen_attention, "GROUP_TOKENS", group_tokens)
    model = tiny_qwen2(attn=VARLEN_SDPA).eval()
    input_ids, mask = skewed_batch(LENGTHS, SEQ_LEN, left=True)
    with torch.no_grad():
        packed = packed_log_probs(model, input_ids, mask)
        alone = _alone(model, input_ids, mask, temperature=1.0)
    torch.testing.assert_close(packed.log_probs, alone, atol=1e-5, rtol=0)


def test_padding_is_cheaper_counts_scores():
    # 3 sequences padded to 25: 3 * 625 = 1875 scores, against the 30-token row's 900.
    assert not varlen_attention._padding_is_cheaper([0, 3, 5, 30])
    # 3 sequences of about 20: 3 * 21^2 = 1323 against 61^2 = 3721.
    assert varlen_attention._padding_is_cheaper([0, 20, 40, 61])


@pytest.mark.parametrize("padded_runs", [True, False], ids=["padded_batch", "block_mask"])
@pytest.mark.parametrize("group_tokens", [12, 10_000])
def test_both_forms_of_a_run_equal_each_sequence_alone_with_gradients(monkeypatch, padded_runs, group_tokens):
    monkeypatch.setattr(varlen_attention, "GROUP_TOKENS", group_tokens)
    monkeypatch.setattr(varlen_attention, "_padding_is_cheaper", lambda offsets: padded_runs)
    input_ids, mask = skewed_batch(LENGTHS, SEQ_LEN, left=True)
    model = tiny_qwen2(attn=VARLEN_SDPA)
    packed = packed_log_probs(model, input_ids, mask)
    (-packed.log_probs.sum()).backward()
    reference = tiny_qwen2()  # the same weights (seeded), plain sdpa on each sequence alone
    alone = _alone(reference, input_ids, mask, temperature=1.0)
    (-alone.sum()).backward()
    torch.testing.assert_close(packed.log_probs, alone, atol=1e-5, rtol=0)
    for (name, param), other in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(param.grad, other.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_gradients_equal_padded():
    input_ids, mask = skewed_batch(LENGTHS, SEQ_LEN, left=False)
    grads = []
    for fn in (packed_log_probs, padded_log_probs):
        model = tiny_qwen2()
        out = fn(model, input_ids, mask, stats=("log_prob", "entropy"), chunk_size=16)
        (-(out.log_probs.sum()) - 0.01 * out.entropy.sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_response_slice():
    model = tiny_qwen2().eval()
    input_ids, mask = skewed_batch(LENGTHS, SEQ_LEN, left=True)
    with torch.no_grad():
        out = packed_log_probs(model, input_ids, mask)
    assert torch.equal(out.response(7).log_probs, out.log_probs[:, -7:])


@pytest.mark.parametrize("chunk_size", [3, 64])
def test_chunked_log_softmax_equals_unchunked(chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(50, 16, requires_grad=True)
    head = torch.nn.Linear(16, 300, bias=False)
    labels = torch.randint(0, 300, (50,))
    logits = head(hidden) / 0.6
    full = torch.log_softmax(logits, -1)
    want_lp = full.gather(-1, labels[:, None])[:, 0]
    want_ent = -(full.exp() * full).sum(-1)
    (want_grad,) = torch.autograd.grad(want_lp.sum() + want_ent.sum(), hidden)

    lp, ent = token_log_probs(hidden, head, labels, temperature=0.6, chunk_size=chunk_size, with_entropy=True)
    torch.testing.assert_close(lp, want_lp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)
    (grad,) = torch.autograd.grad(lp.sum() + ent.sum(), hidden)
    torch.testing.assert_close(grad, want_grad, atol=1e-6, rtol=1e-5)


def test_logit_postprocessing_models_are_refused():
    model = tiny_qwen2()
    model.config.final_logit_softcapping = 30.0
    input_ids, mask = skewed_batch([3], 3, left=False)
    with pytest.raises(NotImplementedError, match="final_logit_softcapping"):
        packed_log_probs(model, input_ids, mask)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_attention_varlen_matches_sdpa():
    pytest.importorskip("flash_attn")
    input_ids, mask = skewed_batch(LENGTHS, SEQ_LEN, left=True)
    input_ids, mask = input_ids.cuda(), mask.cuda()
    results = []
    for attn in ("flash_attention_2", "sdpa"):
        model = tiny_qwen2(attn=attn).to("cuda", torch.bfloat16).eval()
        with torch.no_grad():
            fn = packed_log_probs if attn.startswith("flash") else padded_log_probs
            results.append(fn(model, input_ids, mask).log_probs)
    torch.testing.assert_close(results[0], results[1], atol=3e-2, rtol=0)


class _GroupedHeads(torch.nn.Module):
    """What transformers' ``sdpa`` reads off an attention module: 4 query heads share 2 KV heads."""

    num_key_value_groups = 2
    is_causal = True


@pytest.mark.parametrize("q_len", [1, 5], ids=["decoding_step", "prefill"])
def test_masked_grouped_heads_equal_sdpa_with_copied_heads(q_len):
    # Left-padded rows under a mask, 2 KV heads for 4 query heads: VARLEN_SDPA lets the CPU kernel share
    # the KV heads where transformers' sdpa copies them first. The outputs must be the same.
    generator = torch.Generator().manual_seed(0)
    batch, kv_len, dim = 3, 7, 8
    query = torch.randn(batch, 4, q_len, dim, generator=generator)
    key = torch.randn(batch, 2, kv_len, dim, generator=generator)
    value = torch.randn(batch, 2, kv_len, dim, generator=generator)
    padding = torch.tensor([0, 1, 2])
    valid = torch.arange(kv_len) >= padding[:, None]
    causal = torch.arange(kv_len)[None, :] <= torch.arange(kv_len - q_len, kv_len)[:, None]
    mask = (valid[:, None, :] & causal[None])[:, None]  # [batch, 1, q_len, kv_len]
    module = _GroupedHeads()
    ours, _ = varlen_attention.varlen_sdpa_attention(module, query, key, value, mask)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask)
    assert ours.shape == (batch, q_len, 4, dim)
    torch.testing.assert_close(ours, reference, atol=1e-6, rtol=0)
    # The mask matters here: without it the padded keys would change every row that has padding.
    unmasked, _ = sdpa_attention_forward(module, query, key, value, None)
    assert (unmasked[1:] - reference[1:]).abs().max() > 1e-3
