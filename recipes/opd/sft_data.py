"""The supervised data of off-policy distillation: a teacher's greedy answers to a task's prompts, put in
place of the rows' ground truth, so that `trainer.warm_start.warm_start` trains a student on them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hybridflow.data.chat import render_prompt


@torch.no_grad()
def greedy_answers(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict], max_new_tokens: int
) -> list[str]:
    """The model's greedy completion of each row's prompt (at most ``max_new_tokens`` tokens, decoded
    without special tokens, stripped), in order."""
    prompts = [tokenizer.encode(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False) for row in rows]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left-padded: every row's continuation starts at ``width``
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return [text.strip() for text in tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)]


def relabelled(rows: Sequence[dict], answers: Sequence[str]) -> list[dict]:
    """Copies of ``rows`` whose ``reward_model.ground_truth`` is the matching entry of ``answers`` (the
    teacher's): the supervised targets of off-policy distillation."""
    if len(rows) != len(answers):
        raise ValueError(f"{len(rows)} rows but {len(answers)} answers")
    return [
        {**row, "reward_model": {**row["reward_model"], "ground_truth": answer}}
        for row, answer in zip(rows, answers, strict=True)
    ]
