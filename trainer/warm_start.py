"""Supervised warm-start: teach a fresh policy a task's answer format before RL.

A randomly initialised model never produces a correct answer, so every GRPO group scores zero and
carries no signal. A short supervised phase on (prompt, answer) pairs gets it to partial accuracy.
Accuracy rises steeply near the transition, so the phase stops on an accuracy trigger, checked every
``eval_every_s`` seconds, rather than after a fixed time (which would land anywhere on the slope).

Single process, plain PyTorch: this runs before the worker groups exist.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hybridflow.data.chat import render_prompt
from hybridflow.models.io import load_causal_lm, save_model_dir

__all__ = ["WarmStartConfig", "WarmStartResult", "greedy_accuracy", "warm_start"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WarmStartConfig:
    """When to stop and how to train.

    Attributes:
        target_accuracy: stop once greedy accuracy on the held-out rows reaches this.
        max_seconds: stop after this long regardless.
        eval_every_s: seconds of training between accuracy checks.
        batch_size: sequences per optimizer step.
        lr: AdamW learning rate.
        seed: seed of the batch order.
    """

    target_accuracy: float = 0.3
    max_seconds: float = 300.0
    eval_every_s: float = 3.0
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0


@dataclass(frozen=True)
class WarmStartResult:
    accuracy: float
    seconds: float
    steps: int


def _encode(tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]) -> tuple[list[list[int]], list[str]]:
    prompts = [tokenizer.encode(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False) for row in rows]
    answers = [str(row["reward_model"]["ground_truth"]) for row in rows]
    return prompts, answers


def _training_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[list[int]], answers: list[str], index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids, attention_mask, labels [batch, len]``; labels only on answer + eos."""
    sequences, targets = [], []
    for i in index.tolist():
        answer = [*tokenizer.encode(answers[i], add_special_tokens=False), tokenizer.eos_token_id]
        sequences.append(prompts[i] + answer)
        targets.append([-100] * len(prompts[i]) + answer)
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    labels = torch.full((len(sequences), width), -100)
    for row, (seq, target) in enumerate(zip(sequences, targets, strict=True)):
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        labels[row, : len(target)] = torch.tensor(target)
    return ids, mask, labels


@torch.no_grad()
def greedy_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]) -> float:
    """Fraction of ``rows`` whose greedy answer equals the ground truth exactly."""
    prompts, answers = _encode(tokenizer, rows)
    # One token past the longest answer: room for its end-of-sequence token, nothing more to decode.
    max_new_tokens = max(len(tokenizer.encode(a, add_special_tokens=False)) for a in answers) + 1
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left-padded for generation
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    model.eval()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(t.strip() == a for t, a in zip(texts, answers, strict=True)) / len(answers)


def warm_start(
    model_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    train_rows: Sequence[dict],
    eval_rows: Sequence[dict],
    target_dir: Path,
    config: WarmStartConfig,
) -> WarmStartResult:
    """Train the model in ``model_dir`` on ``train_rows`` until ``config.target_accuracy`` on
    ``eval_rows`` (or ``max_seconds``), and save it with its tokenizer to ``target_dir``."""
    # The model is tiny: one thread costs little, and spares the run OpenMP's spin-wait collapse
    # when the cores are shared with other processes (measured: 0.85 s vs 12 s per step).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_until_target(model_dir, tokenizer, train_rows, eval_rows, target_dir, config)
    finally:
        torch.set_num_threads(threads)


def _train_until_target(
    model_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    train_rows: Sequence[dict],
    eval_rows: Sequence[dict],
    target_dir: Path,
    config: WarmStartConfig,
) -> WarmStartResult:
    model = load_causal_lm(model_dir).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    prompts, answers = _encode(tokenizer, train_rows)
    generator = torch.Generator().manual_seed(config.seed)
    start = last_eval = time.monotonic()
    steps, accuracy = 0, 0.0
    while True:
        index = torch.randint(len(prompts), (config.batch_size,), generator=generator)
        ids, mask, labels = _training_batch(tokenizer, prompts, answers, index)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        now = time.monotonic()
        if now - last_eval >= config.eval_every_s or now - start >= config.max_seconds:
            accuracy = greedy_accuracy(model, tokenizer, eval_rows)
            model.train()
            log.warning("warm-start step %d (%.0f s): loss %.3f, held-out accuracy %.3f", steps, now - start, loss.item(), accuracy)
            last_eval = time.monotonic()
            if accuracy >= config.target_accuracy or now - start >= config.max_seconds:
                break
    save_model_dir(model.eval(), tokenizer, target_dir)
    return WarmStartResult(accuracy, time.monotonic() - start, steps)
