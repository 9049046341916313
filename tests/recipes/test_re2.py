"""recipes/re2: the redo phrase cut, the redo reward, the two-stage rollout's rows, and the loss on them.

Pure functions against hand-computed values; the loss test runs a real tiny Qwen2 and the recipe's own
objective (no Ray).
"""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.data.char_tokenizer import DEFAULT_ALPHABET, build_char_tokenizer
from hybridflow.data.files import read_rows, write_rows
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.rollout import SamplingParams, response_log_probs
from recipes.re2 import main as re2
from recipes.re2 import re2_prefixes as prefixes
from recipes.re2 import re2_redo as redo
from recipes.re2 import re2_task as task
from trainer.config import derive_sizes, derive_values, load_config
from trainer.steps import compute_advantages
from trainer.warm_start import warm_start_folder

PHRASE = redo.REDO_PHRASE
TOKENIZER = build_char_tokenizer()
EOS, PAD = TOKENIZER.eos_token_id, TOKENIZER.pad_token_id


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def decode(tokens: list[int]) -> str:
    return TOKENIZER.decode(tokens, skip_special_tokens=True)


def recipe_config(tmp_path):
    data = task.ensure_task(tmp_path / "data")
    return load_config(
        re2.HERE / "config.yaml",
        [f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'test.parquet'}]"],
    )


# ---------------------------------------------------------------------------- the redo phrase


def test_cut_after_phrase_with_zero_one_and_two_phrases():
    assert redo.cut_after_phrase("47") == "47"
    assert redo.cut_after_phrase(f"4{PHRASE}") == f"4{PHRASE}"
    assert redo.cut_after_phrase(f"4{PHRASE}85") == f"4{PHRASE}"
    # Two phrases: the cut is right after the first; what the second restart wrote is gone.
    assert redo.cut_after_phrase(f"4{PHRASE}8{PHRASE}85") == f"4{PHRASE}"
    assert redo.cut_after_phrase(f"{PHRASE}{PHRASE}") == PHRASE


def test_a_redo_is_the_phrase_with_no_final_answer_after_it():
    assert not redo.is_redo("85")
    assert redo.is_redo(f"8{PHRASE}")
    assert redo.is_redo(f"85{PHRASE}")  # an answer before the phrase is abandoned
    assert not redo.is_redo(f"8{PHRASE}85")  # an answer after the phrase: the sample answered
    assert redo.is_redo(f"8{PHRASE}85{PHRASE}")  # ... unless it gave up again after it
    assert not redo.is_redo(f"8{PHRASE}", phrase="give up")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("47", None), (f"4{PHRASE}", 1 + len(PHRASE)), (f"4{PHRASE}8{PHRASE}85", 1 + len(PHRASE))],
)
def test_phrase_end_token_finds_the_first_phrase(text, expected):
    assert redo.phrase_end_token(ids(text), decode) == expected


def test_phrase_end_token_with_a_phrase_ending_inside_a_token():
    # Tokens of two characters: the phrase "cd" ends inside token 1 ("cd" is split as "bc" + "de").
    pieces = ["ab", "bc", "de"]
    assert redo.phrase_end_token([0, 1, 2], lambda t: "".join(pieces[i] for i in t), phrase="cd") == 3
    assert redo.phrase_end_token([0, 1, 2], lambda t: "".join(pieces[i] for i in t), phrase="bb") == 2


def response_rows(
    responses: list[list[int]], width: int, prefix_rows: list[list[int]] | None = None
) -> Batch:
    tokens = torch.full((len(responses), width), PAD)
    for row, response in enumerate(responses):
        tokens[row, : len(response)] = torch.tensor(response)
    lengths = torch.tensor([len(r) for r in responses])
    batch = Batch(
        {
            "responses": tokens,
            "response_mask": (torch.arange(width) < lengths[:, None]).long(),
            "rollout_log_probs": -(torch.arange(width) + 1.0).repeat(len(responses), 1)
            * (torch.arange(width) < lengths[:, None]),
            "response_lengths": lengths,
        },
        {"finish_reason": ["length" if len(r) == width else "stop" for r in responses]},
    )
    if prefix_rows is not None:
        prompts = Batch(
            {"input_ids": torch.full((len(responses), 2), 5), "attention_mask": torch.ones(len(responses), 2)}
        )
        batch = batch | prefixes.continuation_prompts(prompts, prefix_rows, PAD, prefix_width=width).select(
            "prefix_tokens", "prefix_lengths"
        )
    return batch


def test_cut_after_redo_cuts_the_tokens_and_appends_eos():
    width = 40
    rows = response_rows(
        [
            [*ids("85"), EOS],  # no phrase: unchanged
            ids(f"4{PHRASE}85"),  # cut after the phrase, EOS appended where "8" was
            [*ids(f"4{PHRASE}"), EOS],  # the engine's own EOS right after the phrase is kept
            ids(f"1234567{PHRASE}"),  # the phrase fills the row's 40 tokens: no room for EOS
        ],
        width,
    )
    out = prefixes.cut_after_redo(rows, decode, EOS, PAD)
    end = 1 + len(PHRASE)
    assert out["response_lengths"].tolist() == [3, end + 1, end + 1, width]
    assert out["responses"][1, :end].tolist() == ids(f"4{PHRASE}") and out["responses"][1, end] == EOS
    assert out["responses"][1, end + 1 :].eq(PAD).all()
    assert out["appended_eos"].nonzero().tolist() == [[1, end]]
    # The engine's log-probs stay on the sampled tokens it keeps, 0 on the appended EOS and after.
    assert out["rollout_log_probs"][1, end:].eq(0).all()
    assert out["rollout_log_probs"][2, end] == -(end + 1.0)
    assert out["response_mask"].sum(-1).tolist() == out["response_lengths"].tolist()
    assert out["finish_reason"].tolist() == ["stop", "stop", "stop", "stop"]
    assert decode(out["responses"][3].tolist()) == f"1234567{PHRASE}"


def test_cut_after_redo_reads_the_phrase_across_the_prefix():
    width = 40
    prefix = ids("5It's better")
    rest = ids(" to redo the question.") + ids("7") + [EOS]
    rows = response_rows([rest, [*ids("3"), EOS]], width, prefix_rows=[prefix, ids("8")])
    out = prefixes.cut_after_redo(rows, decode, EOS, PAD)
    # The phrase starts in the prefix and ends in the continuation: the continuation is cut after it.
    kept = len(ids(" to redo the question."))
    assert out["response_lengths"].tolist() == [kept + 1, 2]
    assert out["responses"][0, : kept + 1].tolist() == [*ids(" to redo the question."), EOS]


def test_a_continuation_ending_the_phrase_on_its_last_allowed_token_gets_no_eos():
    width = 40
    # A 7-token prefix leaves 33 tokens of the 40 to the continuation, exactly the phrase: the whole
    # sample is then 40 tokens, the first stage's limit, and an appended EOS would make it 41.
    prefix = ids("1234567")
    rows = response_rows([ids(PHRASE), ids(PHRASE[:-1])], width, prefix_rows=[prefix, prefix[:-1]])
    out = prefixes.cut_after_redo(rows, decode, EOS, PAD)
    room = width - len(prefix)
    assert len(ids(PHRASE)) == room
    # Row 0: cut at its room, no EOS; row 1 (phrase unfinished) is left as it was.
    assert out["response_lengths"].tolist() == [room, room - 1]
    assert (rows["prefix_lengths"] + out["response_lengths"]).max() <= width
    assert not out["appended_eos"].any()
    assert out["responses"][0, :room].tolist() == ids(PHRASE) and out["responses"][0, room:].eq(PAD).all()
    assert out["finish_reason"].tolist() == ["stop", "stop"]


# ---------------------------------------------------------------------------- the redo reward


def test_redo_reward_on_a_hand_made_two_level_batch():
    # (query, prefix) groups of 2 continuations: query 0 has 3 prefix groups, query 1 has 2.
    group_ids = torch.tensor([[0, 0], [0, 0], [0, 1], [0, 1], [0, 2], [0, 2], [1, 0], [1, 0], [1, 1], [1, 1]])
    correct = torch.tensor([1, 1, 0, 0, 1, 0, 0, 0, 0, 1], dtype=torch.bool)  # row 1 is a redo: ignored
    is_redo = torch.tensor([0, 1, 0, 1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    rewards = redo.redo_rewards(correct, is_redo, group_ids, rounds=5)
    # Row 1 (query 0, prefix 0): outside = rows 2-5: correct 1 of 4, redo 1 of 4.
    p_c, p_r = 1 / 4, 1 / 4
    row1 = p_c * (1 - p_r**5) / (1 - p_r)
    # Row 3 (query 0, prefix 1): outside = rows 0, 1, 4, 5: correct 2 of 4 (row 1 is a redo), redo 1 of 4.
    row3 = 2 / 4 * (1 - p_r**5) / (1 - p_r)
    # Rows 6-9: every continuation of the other prefix group redoes: -1.
    expected = [1, row1, 0, row3, 1, 0, -1, -1, -1, -1]
    assert rewards.tolist() == pytest.approx(expected, abs=1e-7)
    assert row1 == pytest.approx(1023 / 3072)
    # R = 1: a redo is worth one more attempt, P_c.
    assert redo.redo_rewards(correct, is_redo, group_ids, rounds=1)[[1, 3]].tolist() == pytest.approx(
        [1 / 4, 2 / 4]
    )


def test_redo_reward_needs_other_prefix_groups():
    with pytest.raises(ValueError, match=r"redo rows \[0\] have no continuation of another prefix"):
        redo.redo_rewards(
            torch.tensor([False, True]), torch.tensor([True, False]), torch.tensor([[0, 0], [0, 0]])
        )
    with pytest.raises(ValueError, match=r"group_ids must be \[batch, 2\]"):
        redo.redo_rewards(torch.tensor([True]), torch.tensor([False]), torch.tensor([0]))


def test_redo_metrics():
    correct = torch.tensor([1, 0, 1, 0], dtype=torch.bool)
    flags = torch.tensor([0, 0, 0, 1], dtype=torch.bool)
    assert redo.redo_metrics(correct, flags) == {
        "re2/redo_rate": 0.25,
        "re2/expected_rounds": pytest.approx(4 / 3),
        "re2/accuracy_non_redo": pytest.approx(2 / 3),
    }
    everything = redo.redo_metrics(correct, torch.ones(4, dtype=torch.bool), "v")
    assert everything["v/expected_rounds"] == math.inf and math.isnan(everything["v/accuracy_non_redo"])


def test_redo_after_right_and_wrong_prefixes():
    # 7 continuations: prefixes of a correct source (rows 0-2), a wrong one (rows 3-4), an empty prefix
    # (row 5, counted in neither) and a prefix of a source that redid itself (row 6, neither).
    redo_flags = torch.tensor([1, 0, 0, 1, 1, 1, 1], dtype=torch.bool)
    source_correct = torch.tensor([1, 1, 1, 0, 0, 1, 0], dtype=torch.bool)
    source_redo = torch.tensor([0, 0, 0, 0, 0, 0, 1], dtype=torch.bool)
    prefix_lengths = torch.tensor([3, 5, 1, 2, 4, 0, 6])
    rates = redo.redo_after_prefixes(redo_flags, source_correct, source_redo, prefix_lengths, "c")
    assert rates == {"c/redo_after_right_prefix": pytest.approx(1 / 3), "c/redo_after_wrong_prefix": 1.0}
    none_wrong = redo.redo_after_prefixes(redo_flags[:3], source_correct[:3], source_redo[:3], prefix_lengths[:3], "c")
    assert math.isnan(none_wrong["c/redo_after_wrong_prefix"])


# ---------------------------------------------------------------------------- the two-stage rollout's rows


def test_cut_lengths_follow_the_ratio_distribution():
    lengths = torch.full((200_000,), 10)
    cuts = prefixes.cut_lengths(lengths, torch.Generator().manual_seed(0), zero_prob=0.3, max_ratio=0.8)
    # k = floor(10 r): 0 with probability 0.3 + 0.7 * P(r < 0.1) = 0.3 + 0.7 / 8, then 1..7 with 0.7 / 8
    # each; never 8 (r < 0.8), so a prefix never holds a whole sample.
    assert (cuts == 0).double().mean().item() == pytest.approx(0.3 + 0.7 / 8, abs=0.005)
    assert int(cuts.max()) == 7 and int(cuts.min()) == 0
    for k in range(1, 8):
        assert (cuts == k).double().mean().item() == pytest.approx(0.7 / 8, abs=0.005)
    assert prefixes.cut_lengths(
        torch.tensor([5, 7]), torch.Generator().manual_seed(1), zero_prob=1.0
    ).tolist() == [0, 0]


def test_continuation_prompts_move_the_prefix_into_the_prompt():
    prompts = Batch(
        {
            "input_ids": torch.tensor([[PAD, 7, 8], [6, 7, 8]]),
            "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]]),
        },
        {"ground_truth": ["15", "21"]},
    )
    out = prefixes.continuation_prompts(prompts, [[9, 10], []], PAD, prefix_width=4)
    assert out["input_ids"].tolist() == [[7, 8, 9, 10], [PAD, 6, 7, 8]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3], [0, 0, 1, 2]]
    assert out["prefix_tokens"].tolist() == [[9, 10, PAD, PAD], [PAD] * 4]
    assert out["prefix_lengths"].tolist() == [2, 0]
    assert out["ground_truth"].tolist() == ["15", "21"]
    with pytest.raises(ValueError, match="wider than prefix_width=1"):
        prefixes.continuation_prompts(prompts, [[9, 10], []], PAD, prefix_width=1)


def test_cap_lengths_keeps_prefix_plus_continuation_within_the_limit():
    rows = response_rows([[1, 2, 3, EOS], [1, EOS], [1, 2, 3, 4]], 4)
    out = prefixes.cap_lengths(rows, torch.tensor([2, 2, 4]), PAD)
    assert out["response_lengths"].tolist() == [2, 2, 4]
    assert out["responses"].tolist() == [[1, 2, PAD, PAD], [1, EOS, PAD, PAD], [1, 2, 3, 4]]
    assert out["rollout_log_probs"][0].tolist() == [-1, -2, 0, 0]
    assert out["finish_reason"].tolist() == ["length", "stop", "length"]


def test_prefix_tokens_carry_no_loss(tmp_path):
    """A continuation row holds its prefix in the prompt: the recipe's DAPO loss reaches the logits that
    predict continuation tokens and never the one that predicts the prefix token."""
    config = recipe_config(tmp_path)
    objective = derive_values(config, derive_sizes(config), 1, "").actor.objective
    model = build_tiny_causal_lm(len(TOKENIZER), seed=0, initializer_range=0.2)
    prompt = Batch(
        {"input_ids": torch.tensor([ids("12+7=")]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
    )
    response = [*ids("19"), EOS]

    def row(prefix_len: int) -> Batch:
        built = prefixes.continuation_prompts(prompt, [response[:prefix_len]], PAD, prefix_width=3)
        rest = response[prefix_len:]
        return built | Batch(
            {"responses": torch.tensor([rest]), "response_mask": torch.ones(1, len(rest), dtype=torch.long)}
        )

    def loss_and_logit_grads(batch: Batch) -> tuple[float, torch.Tensor]:
        sequence = torch.cat([batch["input_ids"], batch["responses"]], dim=1)
        logits = model(input_ids=sequence).logits
        logits.retain_grad()
        width, length = batch["input_ids"].shape[1], batch["responses"].shape[1]
        log_prob = (
            logits[:, width - 1 : width - 1 + length]
            .log_softmax(-1)
            .gather(-1, batch["responses"][..., None])[..., 0]
        )
        mask = batch["response_mask"]
        micro = batch | Batch({"old_log_probs": log_prob.detach(), "advantages": 0.5 * mask.float()})
        loss, _ = objective(log_prob, None, micro, global_tokens=float(mask.sum()), global_seqs=1.0)
        loss.backward()
        return loss.item(), logits.grad[0].abs().sum(-1)

    continuation = row(1)  # prefix "1" in the prompt, "9" and EOS to learn
    assert continuation["input_ids"].tolist() == [ids("12+7=1")]
    loss, grads = loss_and_logit_grads(continuation)
    # Ratio 1, token-mean over the 2 continuation tokens: -A.
    assert loss == pytest.approx(-0.5)
    # Position 4 ("=") predicts the prefix token "1": no gradient. Positions 5, 6 predict "9" and EOS;
    # position 7 (EOS) predicts nothing.
    assert grads[:5].eq(0).all() and (grads[5:7] > 0).all() and grads[7] == 0
    # With the prefix in the response instead, the logit predicting it would be trained.
    _, whole = loss_and_logit_grads(row(0))
    assert whole[4] > 0
    # The continuation's tokens have the log-probs they have in the whole sample (same context).
    full, cont = row(0), continuation
    sampling = SamplingParams(temperature=1.0)
    with torch.no_grad():
        assert torch.allclose(
            response_log_probs(model, cont, sampling),
            response_log_probs(model, full, sampling)[:, 1:],
            atol=1e-5,
        )


# ---------------------------------------------------------------------------- advantages


def test_advantages_are_normalised_within_prefix_groups_not_queries(tmp_path):
    config = recipe_config(tmp_path)
    # One query, two prefix groups of 3: rewards (1, 0, 0) and (1, 1, 0.5).
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.5])
    group_ids = torch.tensor([[0, 0]] * 3 + [[0, 1]] * 3)
    mask = torch.tensor([[1, 1, 0]] * 6)
    rows = Batch(
        {
            "token_level_scores": rewards[:, None] * torch.tensor([0.0, 1.0, 0.0]),
            "response_mask": mask,
            "group_ids": group_ids,
        }
    )
    out = compute_advantages(rows, config.algorithm)["advantages"][:, 0]
    # Group (0, 0): mean 1/3, Bessel std sqrt(1/3); group (0, 1): mean 5/6, std sqrt(1/12).
    first = [(r - 1 / 3) / (math.sqrt(1 / 3) + 1e-6) for r in (1.0, 0.0, 0.0)]
    second = [(r - 5 / 6) / (math.sqrt(1 / 12) + 1e-6) for r in (1.0, 1.0, 0.5)]
    assert out.tolist() == pytest.approx(first + second, abs=1e-5)
    # Normalised over the query instead, the same rows would get other values.
    by_query = compute_advantages(
        rows.select("token_level_scores", "response_mask") | Batch({"group_ids": group_ids[:, 0]}),
        config.algorithm,
    )
    assert not torch.allclose(by_query["advantages"][:, 0], out)


# ---------------------------------------------------------------------------- settings and the task


def test_recipe_settings_defaults_are_the_papers(tmp_path):
    from trainer.config import recipe_settings

    settings = recipe_settings(recipe_config(tmp_path), re2.Re2Settings)
    assert (settings.continuations, settings.zero_cut_prob, settings.max_cut_ratio, settings.redo_rounds) == (
        8,
        0.3,
        0.8,
        5,
    )
    assert settings.redo_phrase == "It's better to redo the question."


def test_the_redo_instruction_names_the_phrase_in_a_system_message(tmp_path):
    from hybridflow.data.chat import render_prompt
    from hybridflow.data.files import read_rows

    question = [{"role": "user", "content": "47+38="}]
    rows = [{"prompt": question, "reward_model": {"ground_truth": "85"}, "data_source": "arithmetic"}]
    (out,) = task.with_redo_instruction(rows, PHRASE)
    system = {"role": "system", "content": task.REDO_INSTRUCTION.format(phrase=PHRASE)}
    assert out == {**rows[0], "prompt": [system, *question]}
    assert f'"{PHRASE}"' in system["content"]
    assert rows[0]["prompt"] == question  # the input rows are not changed
    # The written copy: the same questions and answers, each behind the instruction.
    source = task.ensure_task(tmp_path / "data") / "test.parquet"
    instructed = task.instructed_copy(source, PHRASE, tmp_path / "cache")
    plain = read_rows(source)
    written = read_rows(instructed)
    assert [row["prompt"] for row in written] == [[system, *row["prompt"]] for row in plain]
    assert [row["reward_model"] for row in written] == [row["reward_model"] for row in plain]
    assert render_prompt(TOKENIZER, written[0]["prompt"]).startswith(system["content"])


def test_the_recipe_reads_the_instructed_data_when_asked(tmp_path):
    data = tmp_path / "data"
    plain = re2.task_config([], data)
    assert list(plain.data.train_files) == [str(data / "train.parquet")]
    instructed = re2.task_config(["recipe.instruction=true"], data)
    train, test = (task.instructed_copy(data / f"{split}.parquet", PHRASE, data) for split in ("train", "test"))
    assert train.parent.parent == data and train.parent.name.startswith("instructed-")
    assert list(instructed.data.train_files) == [str(train)]
    assert list(instructed.data.val_files) == [str(test)]
    assert task.instructed_copy(data / "test.parquet", "Start over.", data) != test  # another phrase, other copy
    # A file named on the command line (another task's, a real model's) gets its own instructed copy.
    other = tmp_path / "other" / "test.parquet"
    write_rows(read_rows(data / "test.parquet")[:5], other)
    chosen = re2.task_config(["recipe.instruction=true", f"data.val_files=[{other}]"], data)
    (copy,) = chosen.data.val_files
    assert copy == str(task.instructed_copy(other, PHRASE, data)) and copy != str(test)
    assert [row["prompt"][0]["role"] for row in read_rows(copy)] == ["system"] * 5


def test_redo_rows_replace_a_share_of_the_answers():
    rows = [{"reward_model": {"ground_truth": str(i)}, "prompt": []} for i in range(4000)]
    out = task.redo_rows(rows, share=0.1, seed=0)
    answers = [row["reward_model"]["ground_truth"] for row in out]
    redone = [a for a in answers if a.endswith(PHRASE)]
    assert len(redone) / len(rows) == pytest.approx(0.1, abs=0.015)
    assert all(len(a) == 1 + len(PHRASE) and a[0] in "123456789" for a in redone)
    assert [a for a in answers if not a.endswith(PHRASE)] == [
        str(i) for i, a in enumerate(answers) if not a.endswith(PHRASE)
    ]
    assert rows[0]["reward_model"]["ground_truth"] == "0"  # the input rows are not changed


def test_the_phrase_is_matched_as_the_policys_tokenizer_writes_it():
    # A tokenizer that cannot encode a character of the phrase (an alphabet without the space, which
    # encodes it as <unk>) can only ever write the phrase without it, and that is what a redo must be
    # recognised by.
    no_space = build_char_tokenizer(DEFAULT_ALPHABET.replace(" ", ""))
    written = re2.as_written(no_space, re2.Re2Settings()).redo_phrase
    assert written == PHRASE.replace(" ", "")
    sample = no_space.encode(f"4{PHRASE}85", add_special_tokens=False)

    def decode(ids):
        return no_space.decode(ids, skip_special_tokens=True)

    text = decode(sample)
    assert redo.is_redo(redo.cut_after_phrase(text, written), written)
    assert not redo.is_redo(redo.cut_after_phrase(text, PHRASE), PHRASE)  # the spaced phrase never matches
    assert redo.phrase_end_token(sample, decode, written) == 1 + len(PHRASE)  # the <unk>s count as tokens
    # A tokenizer that keeps every character writes the phrase as it is.
    assert re2.as_written(TOKENIZER, re2.Re2Settings()).redo_phrase == PHRASE


def test_the_redo_warm_start_key_changes_with_the_tokenizer(tmp_path):
    data = task.ensure_task(tmp_path / "data")
    model = build_tiny_causal_lm(len(TOKENIZER), seed=0)
    no_space = build_char_tokenizer(DEFAULT_ALPHABET.replace(" ", ""))
    # The same weights file under two tokenizers (the second writes the phrase without its spaces).
    first = save_model_dir(model, TOKENIZER, tmp_path / "first")
    second = save_model_dir(model, no_space, tmp_path / "second")
    again = save_model_dir(model, build_char_tokenizer(), tmp_path / "again")
    config = task.RedoWarmStart()
    keys = [task.redo_warm_start_key(folder, data, config) for folder in (first, second, again)]
    assert keys[0]["base"] == keys[1]["base"] == keys[2]["base"]
    assert keys[0]["tokenizer"] != keys[1]["tokenizer"]
    assert warm_start_folder(tmp_path, keys[0]) != warm_start_folder(tmp_path, keys[1])
    # An equal tokenizer, saved afresh, gives the equal key: the cache is found again.
    assert keys[0] == keys[2]


def test_restarts_ask_a_redo_again_until_it_answers_or_runs_out():
    # Five questions: right, wrong, redo then right, redo then redo then wrong, redo for ever.
    script = {2: [(True, False)], 3: [(False, True), (False, False)], 4: [(False, True)] * 9}
    asked: list[tuple[list[int], int]] = []

    def attempt(rows, k):
        asked.append((rows.tolist(), k))
        answers = [script[int(row)][k - 1] for row in rows]
        return torch.tensor([c for c, _ in answers]), torch.tensor([r for _, r in answers])

    correct = torch.tensor([True, False, False, False, False])
    flags = torch.tensor([False, False, True, True, True])
    final, still_redo, attempts = redo.restart_outcomes(correct, flags, attempt, restarts=3)
    assert final.tolist() == [True, False, True, False, False]
    assert still_redo.tolist() == [False, False, False, False, True]
    assert attempts.tolist() == [1, 1, 2, 3, 4]
    assert asked == [([2, 3, 4], 1), ([3, 4], 2), ([4], 3)]  # only the redos, each restart once
    asked.clear()
    final, still_redo, attempts = redo.restart_outcomes(correct, flags, attempt, restarts=0)
    assert asked == [] and final.tolist() == correct.tolist() and attempts.tolist() == [1] * 5
    with pytest.raises(ValueError, match="restarts must be >= 0"):
        redo.restart_outcomes(correct, flags, attempt, restarts=-1)
