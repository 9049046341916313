"""The character tokenizer: one token per character, special tokens, save and reload."""

from transformers import AutoTokenizer

from hybridflow.data import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm, load_tokenizer_dir, save_model_dir


def test_round_trip_one_token_per_character():
    tokenizer = build_char_tokenizer()
    text = "What is 12+45?\n<answer>57</answer>"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.convert_ids_to_tokens(ids[:3]) == ["W", "h", "a"]
    assert tokenizer.decode(ids) == text


def test_special_tokens_have_fixed_ids_and_unknown_characters_map_to_unk():
    tokenizer = build_char_tokenizer(alphabet="0123456789+=")
    assert (
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.unk_token_id,
    ) == (0, 1, 2, 3)
    assert len(tokenizer) == 4 + 12
    assert tokenizer("1+x")["input_ids"] == [5, 14, 3]
    assert tokenizer.decode([5, 14, 6, 2], skip_special_tokens=True) == "1+2"


def test_chat_template_is_the_bare_content():
    tokenizer = build_char_tokenizer()
    messages = [{"role": "user", "content": "3+4="}]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "3+4="


def test_saved_tokenizer_loads_back_with_auto_tokenizer(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "12*34=408"
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert loaded.eos_token == "</s>" and loaded.pad_token_id == 0
    assert loaded.padding_side == "left"
    assert loaded.apply_chat_template([{"role": "user", "content": "1+1="}], tokenize=False) == "1+1="


def test_tokenizer_saved_beside_a_qwen2_model_keeps_its_spaces(tmp_path):
    # AutoTokenizer next to a Qwen2 config.json picks Qwen2Tokenizer, whose own pre-tokenizer drops
    # spaces ("It's better" -> "It'sbetter"); load_tokenizer_dir reads the tokenizer as it was saved.
    tokenizer = build_char_tokenizer()
    save_model_dir(build_tiny_causal_lm(len(tokenizer)), tokenizer, tmp_path)
    text = "It's better to redo 12 + 34"
    loaded = load_tokenizer_dir(tmp_path)
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.decode(loaded(text)["input_ids"]) == text
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.padding_side) == (0, 2, "left")
