"""Shared-prefix packing: each distinct prompt runs once, and the response log-probs, entropies and
gradients equal those of the padded forward of the joined rows."""

from __future__ import annotations

import pytest
import torch

from hybridflow.parallel import padded_log_probs, shared_prefix_log_probs
from hybridflow.parallel.shared_prefix import shared_prefix_layout
from tests.parallel._helpers import VOCAB, tiny_qwen2

PROMPTS = [[11, 12, 13], [21], [31, 32]]  # A, B, C


def _rows(prompt_of_row: list[int], response_lengths: list[int], width: int = 6, seed: int = 0):
    """Left-padded prompts (``PROMPTS[prompt_of_row[i]]``) and right-padded random responses."""
    generator = torch.Generator().manual_seed(seed)
    prompt_width = max(len(p) for p in PROMPTS)
    prompt_ids = torch.full((len(prompt_of_row), prompt_width), VOCAB - 1)
    prompt_mask = torch.zeros(len(prompt_of_row), prompt_width, dtype=torch.long)
    for row, which in enumerate(prompt_of_row):
        prompt = PROMPTS[which]
        prompt_ids[row, prompt_width - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[row, prompt_width - len(prompt) :] = 1
    responses = torch.randint(0, VOCAB - 1, (len(prompt_of_row), width), generator=generator)
    response_mask = (torch.arange(width) < torch.tensor(response_lengths)[:, None]).long()
    return prompt_ids, prompt_mask, responses.masked_fill(response_mask == 0, VOCAB - 1), response_mask


def test_layout_packs_each_prompt_once_and_drops_each_last_response_token():
    # Rows: A, A, B, A, C, B with responses of 3, 1, 0, 2, 4, 2 tokens.
    prompt_ids, prompt_mask, responses, response_mask = _rows([0, 0, 1, 0, 2, 1], [3, 1, 0, 2, 4, 2])
    layout = shared_prefix_layout(prompt_ids, prompt_mask, responses, response_mask)
    r = responses.tolist()
    # A, then the branches of rows 0 (2 tokens), 1 (none), 3 (1); B, row 2 (empty), row 5 (1); C, row 4 (3).
    expected = [11, 12, 13, *r[0][:2], *r[3][:1], 21, *r[5][:1], 31, 32, *r[4][:3]]
    assert layout.input_ids.tolist() == [expected]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3, 0, 1, 0, 1, 2, 3, 4]]
    # 12 response tokens are scored; row 0's first from A's last token (index 2), then from its branch.
    assert len(layout.labels) == 12
    row0 = (layout.target_rows == 0).nonzero().flatten()
    assert layout.predictor[row0].tolist() == [2, 3, 4]
    assert layout.labels[row0].tolist() == r[0][:3]
    assert layout.target_cols[row0].tolist() == [0, 1, 2]
    # Row 1's single token and row 3's first are predicted by A's last token too.
    assert layout.predictor[layout.target_rows == 1].tolist() == [2]
    assert layout.predictor[layout.target_rows == 3].tolist() == [2, 5]
    # Every packed token is a query of exactly one segment, and its output row is that query's.
    queries = torch.cat([bucket.query_index.flatten() for bucket in layout.buckets])
    valid = torch.cat([bucket.valid.flatten() for bucket in layout.buckets])
    assert sorted(queries[valid].tolist()) == list(range(13))
    assert valid[layout.output_index].all()
    assert queries[layout.output_index].tolist() == list(range(13))


@pytest.mark.parametrize(
    ("chunk_size", "lengths"),
    [
        (None, [6, 1, 0, 3, 6, 2, 5, 1, 4, 6]),
        (5, [6, 1, 0, 3, 6, 2, 5, 1, 4, 6]),
        # Two long responses among short ones: their branches go through attention calls of their own.
        (None, [90, 1, 0, 3, 60, 2, 5, 1, 4, 6]),
    ],
    ids=["short", "short_chunked", "long_and_short"],
)
def test_shared_prefix_equals_padded_with_gradients(chunk_size, lengths):
    model = tiny_qwen2()
    # Non-adjacent samples of one prompt, prompts of 1-3 tokens, responses of 0, 1 and full length.
    prompt_of_row = [0, 1, 0, 2, 1, 0, 2, 2, 1, 0]
    width = max(lengths)
    prompt_ids, prompt_mask, responses, response_mask = _rows(prompt_of_row, lengths, width)
    buckets = shared_prefix_layout(prompt_ids, prompt_mask, responses, response_mask).buckets
    assert (len(buckets) > 1) == (width > 6)
    stats = ("log_prob", "entropy")
    weights = torch.randn(responses.shape, generator=torch.Generator().manual_seed(1))

    def loss_and_grads(out, mask):
        model.zero_grad()
        ((out.log_probs + 0.3 * out.entropy) * mask * weights).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    shared = shared_prefix_log_probs(
        model, prompt_ids, prompt_mask, responses, response_mask, temperature=0.7, chunk_size=chunk_size, stats=stats
    )
    shared_grads = loss_and_grads(shared, 1)
    joined_ids = torch.cat([prompt_ids, responses], dim=1)
    joined_mask = torch.cat([prompt_mask, response_mask], dim=1)
    padded = padded_log_probs(model, joined_ids, joined_mask, temperature=0.7, stats=stats).response(width)
    padded_grads = loss_and_grads(padded, response_mask)

    assert shared.log_probs.shape == (10, width)
    for name in stats:
        torch.testing.assert_close(shared.values[name], padded.values[name] * response_mask, atol=1e-5, rtol=0)
    assert (shared.log_probs[response_mask == 1] < 0).all()
    for name, grad in padded_grads.items():
        torch.testing.assert_close(shared_grads[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_responses_with_nothing_to_score_stay_connected_to_the_model():
    """A micro-batch whose responses are all masked (rows borrowed to keep ranks in step) still gives a
    loss that backpropagates through the model, with a zero gradient."""
    model = tiny_qwen2()
    prompt_ids, prompt_mask, responses, response_mask = _rows([0, 1], [0, 0])
    out = shared_prefix_log_probs(model, prompt_ids, prompt_mask, responses, response_mask)
    assert torch.equal(out.log_probs, torch.zeros(2, 6))
    out.log_probs.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in model.parameters())


def test_shared_prefix_needs_the_varlen_attention():
    model = tiny_qwen2(attn="sdpa")
    with pytest.raises(ValueError, match=r"hybridflow_varlen_sdpa.*'sdpa'"):
        shared_prefix_log_probs(model, *_rows([0], [2]))


def test_a_row_without_prompt_is_refused_by_number():
    prompt_ids, prompt_mask, responses, response_mask = _rows([0, 1], [2, 2])
    prompt_mask[1] = 0
    with pytest.raises(ValueError, match=r"rows \[1\] have no prompt token"):
        shared_prefix_layout(prompt_ids, prompt_mask, responses, response_mask)
