"""Training-side log-probs: the filters against transformers' warpers, the recomputation against per-row forwards."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from hybridflow.protocol import Batch
from hybridflow.rollout import SamplingParams, filter_logits, response_log_probs, sampling_log_probs
from tests.rollout import _tiny


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 5, 1.0), (1.3, -1, 0.8), (0.5, 12, 0.6)])
def test_filter_matches_transformers_warpers(temperature: float, top_k: int, top_p: float) -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k > 0:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    got = filter_logits(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    assert (~torch.isinf(got)).sum(-1).lt(50).all()
    torch.testing.assert_close(got[~torch.isinf(got)], expected[~torch.isinf(expected)])


def test_unfiltered_log_probs_are_tempered_log_softmax_and_greedy_is_untempered() -> None:
    logits = torch.randn(4, 7, 30, generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(0, 30, (4, 7), generator=torch.Generator().manual_seed(2))
    expected = (logits / 0.6).log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(sampling_log_probs(logits, tokens, 0.6), expected)
    greedy = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(sampling_log_probs(logits, tokens, 0.0, top_k=3, top_p=0.5), greedy)


def test_response_log_probs_on_padded_batch_equal_unpadded_forwards() -> None:
    model = _tiny.model()
    prompts = _tiny.prompts()
    responses = torch.tensor([[5, 6, 7, 0], [8, 2, 0, 0], [9, 9, 9, 9], [4, 0, 0, 0]])
    lengths = torch.tensor([3, 2, 4, 1])
    mask = (torch.arange(4) < lengths.unsqueeze(1)).long()
    rollouts = prompts | Batch({"responses": responses, "response_mask": mask})
    sampling = SamplingParams(temperature=0.9)
    got = response_log_probs(model, rollouts, sampling)
    for row in range(len(prompts)):
        prompt = prompts["input_ids"][row][prompts["attention_mask"][row].bool()]
        response = responses[row, : lengths[row]]
        with torch.no_grad():
            logits = model(torch.cat([prompt, response]).unsqueeze(0)).logits[0]
        expected = sampling_log_probs(logits[len(prompt) - 1 : -1], response, 0.9)
        torch.testing.assert_close(got[row, : lengths[row]], expected, atol=1e-5, rtol=0)
        assert (got[row, lengths[row] :] == 0).all()
