"""recipes/intuitor/premise.py: within-group rank correlations against hand-computed values, and a
response's self-certainty against a direct computation from the model's logits."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.models.tiny import build_tiny_causal_lm
from hybridflow.protocol import Batch
from recipes.intuitor import premise


def test_ties_share_the_mean_of_their_ranks():
    ranks = premise.average_ranks(torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 4.0, 4.0]))
    # 1, 1 -> ranks 1, 2 -> 1.5; 3 -> 3; 4, 4, 4 -> ranks 4, 5, 6 -> 5; 5 -> 7.
    assert ranks.tolist() == [3.0, 1.5, 5.0, 1.5, 7.0, 5.0, 5.0]


def test_spearman_with_ties_and_its_sign():
    certainty = torch.tensor([0.3, 0.1, 0.4, 0.2])
    correct = torch.tensor([0.0, 0.0, 1.0, 1.0])
    # Ranks of x: 3, 1, 4, 2; of y: 1.5, 1.5, 3.5, 3.5. Centred: (0.5, -1.5, 1.5, -0.5) and (-1, -1, 1, 1):
    # sum of products -0.5 + 1.5 + 1.5 - 0.5 = 2, norms sqrt(5) and 2 -> 2 / (2 sqrt 5) = 1 / sqrt 5.
    assert premise.spearman(certainty, correct) == pytest.approx(1 / math.sqrt(5), abs=1e-12)
    assert premise.spearman(certainty, 1 - correct) == pytest.approx(-1 / math.sqrt(5), abs=1e-12)
    assert premise.spearman(certainty, certainty * 10 + 3) == pytest.approx(1.0, abs=1e-12)  # monotone
    assert premise.spearman(certainty, torch.ones(4)) is None  # no variance: undefined, not 0


def test_only_groups_where_both_vary_are_kept():
    x = torch.tensor([1.0, 2.0, 3.0, 5.0, 6.0, 7.0, 4.0, 4.0, 4.0, 1.0, 3.0, 2.0, 9.0])
    y = torch.tensor([0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4])
    # Group 1: y constant; group 2: x constant; group 4: one sample. Both kept groups by hand:
    # group 0: ranks (1, 2, 3) and (1, 2.5, 2.5): centred (-1, 0, 1), (-1, 0.5, 0.5) -> 1.5 / (sqrt2 sqrt1.5);
    # group 3: ranks (1, 3, 2) and (3, 1.5, 1.5): centred (-1, 1, 0), (1, -0.5, -0.5) -> -1.5 / (same).
    rhos = premise.within_group_spearman(x, y, group)
    expected = 1.5 / math.sqrt(2 * 1.5)
    torch.testing.assert_close(rhos, torch.tensor([expected, -expected], dtype=torch.float64))


def test_summary_over_groups():
    summary = premise.summarise(torch.tensor([1.0, 0.5, -0.5], dtype=torch.float64), resamples=2000)
    assert summary.groups == 3
    assert summary.mean == pytest.approx(1 / 3)
    # Deviations 2/3, 1/6, -5/6: squares sum to 7/6, over n - 1 = 2 -> std sqrt(7/12).
    assert summary.std == pytest.approx(math.sqrt(7 / 12))
    assert summary.standard_error == pytest.approx(math.sqrt(7 / 12) / math.sqrt(3))
    assert (summary.positive, summary.negative) == (2, 1)
    # Bootstrap means lie between the smallest and largest value, around the mean.
    assert -0.5 <= summary.ci_low < 1 / 3 < summary.ci_high <= 1.0
    assert premise.summarise(torch.tensor([], dtype=torch.float64)).groups == 0


def test_response_self_certainty_matches_the_logits():
    vocab, temperature = 50, 0.9
    model = build_tiny_causal_lm(vocab, initializer_range=0.2, seed=3).eval()
    # Two rows: a left-padded prompt of 2 real tokens with 3 response tokens, and 3 real prompt tokens
    # with 2 response tokens and one of padding.
    rollouts = Batch(
        {
            "input_ids": torch.tensor([[0, 7, 8], [4, 5, 6]]),
            "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
            "responses": torch.tensor([[9, 10, 11], [12, 13, 0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        }
    )
    got = premise.response_self_certainty(model, rollouts, temperature, chunk_size=2)
    expected = []
    for sequence, prompt_len in (([7, 8, 9, 10, 11], 2), ([4, 5, 6, 12, 13], 3)):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([sequence])).logits[0].double() / temperature
        # The logits before each response token: KL(U || p) = logsumexp(z) - mean(z) - log V.
        before = logits[prompt_len - 1 : len(sequence) - 1]
        per_token = torch.logsumexp(before, dim=-1) - before.mean(dim=-1) - math.log(vocab)
        expected.append(float(per_token.mean()))
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), atol=1e-5, rtol=0)
    assert min(expected) > 0.01  # a peaked model: the check is not comparing two near-zero numbers
