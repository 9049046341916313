"""Tiny model builder and HF directory round trips."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, load_causal_lm, read_special_token_ids, save_model_dir


def test_same_seed_same_weights_other_seed_other_weights() -> None:
    a, b, c = (build_tiny_causal_lm(40, seed=s) for s in (3, 3, 4))
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    # Building a model must not consume the caller's random stream.
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    build_tiny_causal_lm(40, seed=9)
    assert torch.equal(torch.rand(1), expected)


def test_bad_head_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        build_tiny_causal_lm(40, hidden_size=64, num_heads=3)


def test_save_and_load_round_trip_keeps_logits_and_special_ids(tmp_path: Path) -> None:
    tokenizer = build_char_tokenizer("0123456789+=")
    model = build_tiny_causal_lm(len(tokenizer), seed=1, dtype=torch.float32)
    save_model_dir(model, tokenizer, tmp_path)
    loaded = load_causal_lm(tmp_path, torch.float32)
    ids = torch.tensor([tokenizer("12+7=")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)
    assert read_special_token_ids(tmp_path) == ((tokenizer.eos_token_id,), tokenizer.pad_token_id)
    assert load_causal_lm(tmp_path, torch.bfloat16).lm_head.weight.dtype == torch.bfloat16
