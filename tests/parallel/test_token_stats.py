"""Token statistics: the registry, chunked against unchunked, and self-certainty's known values."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.algos import UnknownNameError
from hybridflow.parallel import (
    TOKEN_STATISTICS,
    TokenStatistic,
    register_token_statistic,
    resolve_token_statistics,
    token_statistics,
)

VOCAB = 50


def reference(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each statistic from the full softmax, written out."""
    log_p = torch.log_softmax(logits, -1)
    return {
        "log_prob": log_p.gather(-1, labels[:, None])[:, 0],
        "entropy": -(log_p.exp() * log_p).sum(-1),
        # KL(U || p) = sum_v (1/V) log((1/V) / p_v)
        "self_certainty": (-math.log(logits.shape[-1]) - log_p).mean(-1),
    }


@pytest.mark.parametrize("chunk_size", [None, 1, 7, 64])
def test_chunked_statistics_equal_the_full_softmax(chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(37, 16, requires_grad=True)
    head = torch.nn.Linear(16, VOCAB, bias=False)
    labels = torch.randint(0, VOCAB, (37,))
    names = ("log_prob", "entropy", "self_certainty")
    got = token_statistics(hidden, head, labels, names, temperature=0.7, chunk_size=chunk_size)
    unchunked = token_statistics(hidden, head, labels, names, temperature=0.7, chunk_size=None)
    want = reference(head(hidden) / 0.7, labels)
    torch.testing.assert_close(got, unchunked, atol=1e-6, rtol=0)
    for k, name in enumerate(names):
        # The full-softmax formulas sum in another order: fp32 rounding of a few 1e-6.
        torch.testing.assert_close(got[:, k], want[name], atol=1e-5, rtol=0, msg=name)
    # Chunks are recomputed in backward: the gradient must be the unchunked one.
    (grad,) = torch.autograd.grad(got.sum(), hidden)
    (want_grad,) = torch.autograd.grad(sum(v.sum() for v in want.values()), hidden)
    torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-5)


def test_self_certainty_is_zero_for_uniform_and_the_closed_form_for_a_peaked_prediction():
    head = torch.nn.Identity()
    labels = torch.zeros(3, dtype=torch.long)
    uniform = torch.full((3, VOCAB), 2.5)
    (value,) = token_statistics(uniform, head, labels, ["self_certainty"]).unbind(-1)
    torch.testing.assert_close(value, torch.zeros(3), atol=1e-6, rtol=0)
    # One logit c above the rest: KL(U || p) = log(e^c + V - 1) - c / V - log V, by hand.
    for c in (5.0, 20.0):
        peaked = torch.zeros(1, VOCAB)
        peaked[0, 3] = c
        (value,) = token_statistics(peaked, head, labels[:1], ["self_certainty"]).unbind(-1)
        expected = math.log(math.exp(c) + VOCAB - 1) - c / VOCAB - math.log(VOCAB)
        assert value.item() == pytest.approx(expected, abs=1e-5)
    # Near one-hot it exceeds log |V| (the KL from the prediction to uniform would approach log |V|).
    assert expected > math.log(VOCAB)


def test_a_statistic_registered_here_is_used_by_name_and_unknown_names_list_the_choices():
    @register_token_statistic("top_prob_for_test")
    def top_prob(logits, log_norm, labels):
        return torch.exp(logits.max(-1).values - log_norm)

    try:
        logits = torch.randn(5, VOCAB)
        labels = torch.zeros(5, dtype=torch.long)
        got = token_statistics(logits, torch.nn.Identity(), labels, ["top_prob_for_test"])[:, 0]
        torch.testing.assert_close(got, torch.softmax(logits, -1).max(-1).values)
        assert resolve_token_statistics(["top_prob_for_test"]) == (TokenStatistic("top_prob_for_test", top_prob),)
    finally:
        TOKEN_STATISTICS.unregister("top_prob_for_test")
    with pytest.raises(UnknownNameError, match=r"top_prob_for_test.*valid choices: entropy, log_prob, self_certainty"):
        resolve_token_statistics(["top_prob_for_test"])
    with pytest.raises(ValueError, match="more than once"):
        resolve_token_statistics(["entropy", "entropy"])
