"""The data of off-policy distillation: the teacher's greedy answers (`trainer.warm_start.greedy_answers`,
batched, left-padded) against a one-row-at-a-time argmax decode, and the relabelled rows
(recipes/opd/sft_data.py) by hand."""

from __future__ import annotations

import copy

import pytest
import torch

from hybridflow.data import build_char_tokenizer
from hybridflow.data.chat import render_prompt
from hybridflow.models import build_tiny_causal_lm
from recipes.opd.sft_data import relabelled
from trainer.warm_start import greedy_answers

ROWS = [
    {"prompt": [{"role": "user", "content": "7+5="}], "reward_model": {"style": "rule", "ground_truth": "12"}},
    {"prompt": [{"role": "user", "content": "47+38="}], "reward_model": {"style": "rule", "ground_truth": "85"}},
]


def test_relabelled_replaces_only_the_ground_truth() -> None:
    original = copy.deepcopy(ROWS)
    rows = relabelled(ROWS, ["13", "84"])
    assert [row["reward_model"]["ground_truth"] for row in rows] == ["13", "84"]
    assert [row["reward_model"]["style"] for row in rows] == ["rule", "rule"]
    assert [row["prompt"] for row in rows] == [row["prompt"] for row in ROWS]
    assert original == ROWS  # the inputs are left as they were
    with pytest.raises(ValueError, match="2 rows but 1 answers"):
        relabelled(ROWS, ["13"])


@torch.no_grad()
def test_greedy_answers_equal_an_unpadded_argmax_decode() -> None:
    tokenizer = build_char_tokenizer()
    model = build_tiny_causal_lm(
        vocab_size=len(tokenizer),
        max_position_embeddings=64,
        seed=3,
        initializer_range=0.05,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    ).eval()
    expected = []
    for row in ROWS:  # the reference: one row, no padding, the argmax appended until eos or 5 tokens
        ids = tokenizer.encode(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False)
        new: list[int] = []
        for _ in range(5):
            token = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            if token == tokenizer.eos_token_id:
                break
            new.append(token)
        expected.append(tokenizer.decode(new, skip_special_tokens=True).strip())
    assert greedy_answers(model, tokenizer, ROWS, max_new_tokens=5) == expected
    assert any(expected)  # the random model does say something: the comparison is not of empty strings
