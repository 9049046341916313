"""The ``actor.lora`` section (its docs rows, its errors) and the adapter functions against PEFT's own
loading and merging, on a tiny model in this process."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from peft import PeftModel

from hybridflow.data import write_rows
from hybridflow.lora import (
    LoraConfig,
    adapters_disabled,
    add_adapters,
    is_adapter_name,
    merge_adapters,
    save_peft_adapter,
)
from hybridflow.models import build_tiny_causal_lm
from tests.trainer._config_docs import documented_defaults
from trainer.config import ConfigError, config_from_dict, config_to_dict

VOCAB = 30
LORA = LoraConfig(rank=4, alpha=12.0, target_modules=("q_proj", "o_proj", "gate_proj"), seed=1)


def adapted_model(seed: int = 2) -> torch.nn.Module:
    """A tiny model with ``LORA``'s adapters, ``B`` drawn at random so that they act."""
    model = add_adapters(build_tiny_causal_lm(VOCAB, seed=seed), LORA).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
    return model


def inputs() -> torch.Tensor:
    return torch.randint(3, VOCAB, (3, 9), generator=torch.Generator().manual_seed(0))


def test_docs_give_every_lora_key_with_its_default():
    documented = documented_defaults()
    assert documented["actor.lora"] is None
    for spec in dataclasses.fields(LoraConfig):
        key = f"actor.lora.{spec.name}"
        assert key in documented, f"docs/config.md lacks {key}"
        assert documented[key] == config_to_dict(spec.default), key


@pytest.fixture
def data_files(tmp_path):
    row = {"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}
    files = {}
    for split in ("train", "test"):
        write_rows([row], tmp_path / f"{split}.parquet")
        files[f"{split}_files"] = [str(tmp_path / f"{split}.parquet")]
    return {"data": {"train_files": files["train_files"], "val_files": files["test_files"]}}


def test_a_lora_section_loads(data_files):
    config = config_from_dict({**data_files, "actor": {"lora": {"rank": 16, "target_modules": ["q_proj"]}}})
    assert config.actor.lora == LoraConfig(rank=16, target_modules=("q_proj",))
    assert config_from_dict(data_files).actor.lora is None


def test_bad_lora_values_name_their_keys(data_files):
    with pytest.raises(ConfigError) as info:
        config_from_dict({**data_files, "actor": {"lora": {"rank": 0, "push": "merge", "alfa": 2}}})
    problems = "\n".join(info.value.problems)
    assert "actor.lora.rank: must be >= 1, got 0" in problems
    assert "actor.lora.push:" in problems and "did you mean 'merged'" in problems
    assert "actor.lora.alfa: unknown key; did you mean 'actor.lora.alpha'?" in problems


def test_targets_that_match_no_layer_name_the_key():
    with pytest.raises(ValueError, match=r"actor\.lora\.target_modules \['qkv'\]"):
        add_adapters(build_tiny_causal_lm(VOCAB), dataclasses.replace(LORA, target_modules=("qkv",)))


def test_only_the_adapters_train_and_disabling_them_gives_the_base_model():
    model, base = adapted_model(), build_tiny_causal_lm(VOCAB, seed=2).eval()
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable and all(is_adapter_name(name) for name in trainable)
    with torch.no_grad():
        adapted = model(inputs()).logits
        with adapters_disabled(model):
            assert torch.equal(model(inputs()).logits, base(inputs()).logits)
        assert (adapted - base(inputs()).logits).abs().max() > 0.1
    assert {name for name, param in model.named_parameters() if param.requires_grad} == trainable


def test_the_adapter_directory_and_the_merge_agree_with_peft(tmp_path):
    model = adapted_model()
    state = model.state_dict()
    adapters = {name: tensor for name, tensor in state.items() if is_adapter_name(name)}
    save_peft_adapter(tmp_path / "adapter", adapters, LORA)
    loaded = PeftModel.from_pretrained(build_tiny_causal_lm(VOCAB, seed=2), tmp_path / "adapter").eval()
    merged = build_tiny_causal_lm(VOCAB, seed=0).eval()
    merged.load_state_dict(dict(merge_adapters(state.items(), LORA.scaling)))
    with torch.no_grad():
        expected = model(inputs()).logits
        assert (loaded(inputs()).logits - expected).abs().max() < 1e-6
        assert (merged(inputs()).logits - expected).abs().max() < 1e-5
    # PEFT's own merge of the loaded directory gives the same weights as ours.
    peft_merged = loaded.merge_and_unload().state_dict()
    ours = merged.state_dict()
    assert ours.keys() == peft_merged.keys()
    assert all(torch.allclose(ours[name], peft_merged[name], atol=1e-6) for name in ours)


def test_a_merge_missing_an_adapter_is_refused():
    state = {name: t for name, t in adapted_model().state_dict().items() if ".lora_B." not in name}
    with pytest.raises(ValueError, match="missing a base weight or an adapter"):
        list(merge_adapters(state.items(), LORA.scaling))

