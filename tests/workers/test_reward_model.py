"""`RewardModelWorker` on FSDP2 over real Ray + gloo ranks, against the Hugging Face model run row by row.

One group of two ranks holds three reward-model roles: packed, padded with token-budget micro-batches,
and re-tokenising from text with a tokenizer whose ids differ from the policy's.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from hybridflow.controller import ResourcePool, RoleSpec, WorkerError, create_colocated_worker_groups
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.protocol import Batch
from tests.workers._policy import ALPHABET, write_reward_model
from workers.config import RewardModelConfig
from workers.reward_model import RewardModelWorker

# (prompt tokens, response tokens) per row: different lengths, and one empty response.
LENGTHS = [(6, 8), (2, 1), (4, 0), (3, 5), (5, 8)]
PROMPT_LEN, RESPONSE_LEN = 6, 8
# fp32 sums in another order (packed, padded, sharded) moved scores of size ~1 by at most 1.4e-6;
# reading the score at another token, or letting padding into the attention, moves it by ~1e-2 or more.
ATOL = 1e-5
PAD_ID = 0


def scored_batch(policy_tokenizer) -> Batch:
    """Left-padded prompts, right-padded responses of characters (row 3 ending with the pad id, as with
    an end-of-sequence id equal to the pad id), and the same rows as text: ``raw_prompt`` chat
    messages and ``response_text``."""
    generator = torch.Generator().manual_seed(4)
    rows = len(LENGTHS)
    input_ids = torch.zeros(rows, PROMPT_LEN, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    responses = torch.zeros(rows, RESPONSE_LEN, dtype=torch.long)
    response_mask = torch.zeros_like(responses)
    prompts, texts = [], []
    for i, (p, r) in enumerate(LENGTHS):
        prompt = torch.randint(4, len(policy_tokenizer), (p,), generator=generator)
        response = torch.randint(4, len(policy_tokenizer), (r,), generator=generator)
        input_ids[i, PROMPT_LEN - p :] = prompt
        attention_mask[i, PROMPT_LEN - p :] = 1
        if i == 3:
            response[-1] = PAD_ID
        responses[i, :r] = response
        response_mask[i, :r] = 1
        prompts.append([{"role": "user", "content": policy_tokenizer.decode(prompt)}])
        texts.append(policy_tokenizer.decode(response))
    return Batch(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "responses": responses,
            "response_mask": response_mask,
        },
        {"raw_prompt": prompts, "response_text": texts},
    )


def reference_scores(rm_dir: str, rows: list[torch.Tensor]) -> torch.Tensor:
    """The Hugging Face classifier's head at the last token of each row run alone, unpadded: ``[batch]``.

    Read at the last token directly: the classifier's own pooling skips trailing tokens equal to the
    pad id, which row 3 ends with (as responses do where the end-of-sequence id is the pad id).
    """
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, local_files_only=True).eval()
    with torch.no_grad():
        return torch.stack(
            [model.score(model.model(input_ids=ids.unsqueeze(0)).last_hidden_state)[0, -1, 0] for ids in rows]
        )


def policy_rows(batch: Batch) -> list[torch.Tensor]:
    return [
        torch.cat([batch["input_ids"][i][batch["attention_mask"][i].bool()], batch["responses"][i, :r]])
        for i, (_, r) in enumerate(LENGTHS)
    ]


@pytest.fixture(scope="module")
def setup(ray_cluster, tmp_path_factory):
    policy_tokenizer = build_char_tokenizer(ALPHABET)
    rm_dir = str(write_reward_model(tmp_path_factory.mktemp("reward_model"), policy_tokenizer))
    # Same characters, reversed ids: scoring the policy's ids with it would give other scores.
    text_tokenizer = build_char_tokenizer(ALPHABET[::-1])
    text_tokenizer_dir = tmp_path_factory.mktemp("rm_tokenizer")
    text_tokenizer.save_pretrained(text_tokenizer_dir)
    # fp32 compute: the default picks bf16 on CPUs with bf16 units, and the comparisons are exact.
    section = RewardModelConfig(path=rm_dir, param_dtype="float32")
    configs = {
        "packed": dataclasses.replace(section, forward_micro_batch_size=2),
        "padded": dataclasses.replace(
            section, use_packing=False, dynamic_batching=True, max_tokens_per_micro_batch=16
        ),
        "text": dataclasses.replace(section, forward_micro_batch_size=2, tokenizer=str(text_tokenizer_dir)),
    }
    pool = ResourcePool([2], cpus_per_slot=0.5, name="reward-model")
    roles = {name: RoleSpec(RewardModelWorker, (config,)) for name, config in configs.items()}
    groups = create_colocated_worker_groups(pool, roles, name="reward-model")
    try:
        for group in groups.values():
            group.init_model()
        batch = scored_batch(policy_tokenizer)
        # Five rows over two ranks: the dispatch pads one row and drops its output again.
        outputs = {name: group.compute_rm_score(batch) for name, group in groups.items()}
        yield {
            "rm_dir": rm_dir,
            "batch": batch,
            "outputs": outputs,
            "text_tokenizer": text_tokenizer,
            "groups": groups,
        }
    finally:
        groups["packed"].hosts.shutdown()
        pool.release()


def test_scores_on_two_ranks_equal_each_row_scored_alone(setup):
    rows = policy_rows(setup["batch"])
    expected = reference_scores(setup["rm_dir"], rows)
    assert expected.std() > 0.1, "rows must score differently for the comparison to mean anything"
    # Pooling by pad id (the Hugging Face rule) would score row 3 at its second-to-last token: measured
    # 0.04 away, 4000 times the tolerance.
    classifier = AutoModelForSequenceClassification.from_pretrained(setup["rm_dir"], local_files_only=True)
    with torch.no_grad():
        pooled_by_pad_id = classifier(input_ids=rows[3].unsqueeze(0)).logits[0, 0]
    assert (pooled_by_pad_id - expected[3]).abs() > 0.01
    for name in ("packed", "padded"):
        torch.testing.assert_close(setup["outputs"][name]["rm_scores"], expected, rtol=0, atol=ATOL)


def test_token_level_score_sits_on_the_last_valid_response_token(setup):
    out = setup["outputs"]["packed"]
    scores = out["rm_scores"]
    expected = torch.zeros(len(LENGTHS), RESPONSE_LEN)
    for i, (_, r) in enumerate(LENGTHS):
        if r:
            expected[i, r - 1] = scores[i]
    # The empty response (row 2) is still scored, from its prompt, but has no token to carry it.
    assert scores[2] != 0
    torch.testing.assert_close(out["token_level_rm_scores"], expected, rtol=0, atol=0)


def test_retokenised_text_is_scored_with_the_reward_models_tokenizer(setup):
    batch, tokenizer = setup["batch"], setup["text_tokenizer"]
    rows = [
        torch.tensor(tokenizer(m[0]["content"] + text, add_special_tokens=False)["input_ids"])
        for m, text in zip(batch["raw_prompt"], batch["response_text"], strict=True)
    ]
    expected = reference_scores(setup["rm_dir"], rows)
    scores = setup["outputs"]["text"]["rm_scores"]
    torch.testing.assert_close(scores, expected, rtol=0, atol=ATOL)
    assert (scores - setup["outputs"]["packed"]["rm_scores"]).abs().max() > 0.1, "the ids must differ"


def test_retokenising_without_text_columns_is_refused(setup):
    tokens_only = setup["batch"].select("input_ids", "attention_mask", "responses", "response_mask")
    with pytest.raises(WorkerError, match="must carry the text columns"):
        setup["groups"]["text"].compute_rm_score(tokens_only)
