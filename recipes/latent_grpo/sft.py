"""The supervised stage before RL: teach a fresh tiny model a reasoning format (`recipes.latent_grpo.task`).

Latent-GRPO starts from a model that already reasons in latent steps (the paper's latent-SFT model). Here
a short supervised stage teaches that on the arithmetic task: at a latent position the target is the
step's distribution (soft cross-entropy) and the next input is the same mixture of token embeddings, the
input a noise-free latent rollout feeds. The explicit format trains the same way with one-hot steps,
which is plain next-token cross-entropy: the start of the explicit GRPO baseline.

Single process, plain PyTorch, a fixed number of steps from a fixed seed; the result is cached under a
key of everything that determines it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hybridflow.data import read_rows
from hybridflow.data.chat import render_prompt
from hybridflow.models.io import load_causal_lm, load_tokenizer_dir, save_model_dir
from hybridflow.protocol import Batch
from hybridflow.rollout import HFRolloutEngine, SamplingParams
from recipes.latent_grpo.latent import LatentSampling
from recipes.latent_grpo.rollout import latent_rollout
from recipes.latent_grpo.task import (
    END_OF_THINKING,
    Step,
    answer_after_thinking,
    explicit_steps,
    latent_steps,
    operands,
)

__all__ = ["SFTConfig", "held_out_accuracy", "step_batch", "supervised_model", "train_supervised"]

log = logging.getLogger(__name__)

FORMATS: dict[str, Callable[[PreTrainedTokenizerBase, int, int], list[Step]]] = {
    "latent": latent_steps,
    "explicit": explicit_steps,
}
RECORD_FILE = "sft.json"


@dataclass(frozen=True)
class SFTConfig:
    """The supervised stage: ``steps`` AdamW steps of ``batch_size`` rows (drawn with replacement from
    ``seed``) at constant ``lr``."""

    steps: int = 300
    batch_size: int = 128
    lr: float = 3e-3
    seed: int = 0


def step_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[list[int]], responses: Sequence[list[Step]], vocab: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded supervised rows of prompts followed by step responses.

    Returns:
        ``weights [batch, len, vocab]``: the input mixture of every position (one-hot for tokens);
        ``attention_mask [batch, len]``; ``targets [batch, len, vocab]``: at position ``j`` the
        distribution position ``j`` should predict (the step at ``j + 1``), zero where nothing is
        trained (the prompt, padding); ``target_mask [batch, len]``.
    """
    width = max(len(p) + len(r) for p, r in zip(prompts, responses, strict=True))
    weights = torch.zeros(len(prompts), width, vocab)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    targets = torch.zeros(len(prompts), width, vocab)
    target_mask = torch.zeros(len(prompts), width, dtype=torch.bool)
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        steps = [{i: 1.0} for i in prompt] + list(response)
        for j, step in enumerate(steps):
            for token, weight in step.items():
                weights[row, j, token] = weight
        mask[row, : len(steps)] = 1
        for j, step in enumerate(response):
            position = len(prompt) - 1 + j
            for token, weight in step.items():
                targets[row, position, token] = weight
            target_mask[row, position] = True
    return weights, mask, targets, target_mask


def _loss(model: PreTrainedModel, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    weights, mask, targets, target_mask = batch
    embeds = weights @ model.get_input_embeddings().weight
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions, use_cache=False).logits
    cross_entropy = -(targets * logits.float().log_softmax(-1)).sum(-1)
    return cross_entropy[target_mask].mean()


def train_supervised(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    response_format: str,
    config: SFTConfig,
) -> float:
    """Train ``model`` in place on ``rows`` (arithmetic prompts) in ``response_format`` (``latent`` or
    ``explicit``); returns the last step's loss."""
    steps_of = FORMATS[response_format]
    prompts, responses = [], []
    for row in rows:
        text = render_prompt(tokenizer, row["prompt"])
        prompts.append(tokenizer.encode(text, add_special_tokens=False))
        responses.append(steps_of(tokenizer, *operands(text)))
    vocab = model.get_input_embeddings().weight.shape[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    loss = torch.tensor(float("nan"))
    for _ in range(config.steps):
        index = torch.randint(len(prompts), (config.batch_size,), generator=generator).tolist()
        batch = step_batch(tokenizer, [prompts[i] for i in index], [responses[i] for i in index], vocab)
        loss = _loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    return loss.item()


def supervised_model(
    initial_dir: Path, train_files: Sequence[str], response_format: str, cache_dir: Path, config: SFTConfig
) -> Path:
    """The model of ``initial_dir`` after the supervised stage in ``response_format``, trained once and
    cached as ``cache_dir/sft-<format>-<key>`` (the key hashes the initial weights, the data files and
    ``config``); returns that HF model directory."""
    digest = hashlib.sha256(json.dumps(asdict(config), sort_keys=True).encode())
    for path in [*sorted(initial_dir.glob("*.safetensors")), *map(Path, train_files)]:
        digest.update(path.read_bytes())
    target = cache_dir / f"sft-{response_format}-{digest.hexdigest()[:12]}"
    if (target / RECORD_FILE).exists():
        return target
    model = load_causal_lm(initial_dir)
    tokenizer = load_tokenizer_dir(initial_dir)
    rows = [row for path in train_files for row in read_rows(path)]
    start = time.monotonic()
    threads = torch.get_num_threads()
    # One thread: a tiny model gains little from more, and shared cores punish OpenMP's spin-waits.
    torch.set_num_threads(1)
    try:
        loss = train_supervised(model, tokenizer, rows, response_format, config)
    finally:
        torch.set_num_threads(threads)
    save_model_dir(model, tokenizer, target)
    record = {"format": response_format, "loss": loss, "seconds": time.monotonic() - start, **asdict(config)}
    (target / RECORD_FILE).write_text(json.dumps(record, indent=1))
    log.warning("supervised %s stage: loss %.3f in %.0f s", response_format, loss, record["seconds"])
    return target


@torch.no_grad()
def held_out_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    rows: Sequence[dict],
    response_format: str,
    max_new_tokens: int,
    top_k: int = 10,
) -> tuple[float, float]:
    """Greedy accuracy (`answer_after_thinking`) and mean response length (latent steps + tokens) on
    ``rows``; the latent format decodes with `latent_rollout` without noise, the explicit one with the
    HF engine's greedy ``generate``."""
    encoded = tokenizer(
        [render_prompt(tokenizer, row["prompt"]) for row in rows], padding=True, return_tensors="pt",
        add_special_tokens=False,
    )
    prompts = Batch({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})
    engine = HFRolloutEngine(model, (tokenizer.eos_token_id,), tokenizer.pad_token_id)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    if response_format == "latent":
        latent = LatentSampling(top_k=top_k, end_of_thinking_id=tokenizer.convert_tokens_to_ids(END_OF_THINKING))
        embedding = model.get_input_embeddings().weight.detach()
        out = latent_rollout(
            engine.embedding_session, embedding, prompts, greedy, latent, engine.eos_token_ids,
            engine.pad_token_id, torch.Generator().manual_seed(0),
        )
    else:
        out = engine.generate(prompts, greedy)
    texts = tokenizer.batch_decode(
        [ids[mask.bool()].tolist() for ids, mask in zip(out["responses"], out["response_mask"], strict=True)],
        skip_special_tokens=True,
    )
    scores = [
        answer_after_thinking("", text, row["reward_model"]["ground_truth"]) for text, row in zip(texts, rows, strict=True)
    ]
    return sum(scores) / len(scores), out["response_lengths"].float().mean().item()
