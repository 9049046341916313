"""Supervised warm-start: teach a fresh policy a task's answer format before RL.

A randomly initialised model never produces a correct answer, so every GRPO group scores zero and
carries no signal. A short supervised phase on (prompt, answer) pairs gets it to partial accuracy.

The phase runs a fixed number of optimizer steps from a fixed seed, then, while held-out accuracy is
below `WarmStartConfig.min_accuracy`, more steps in blocks of ``extend_every`` up to ``max_steps``. Every
decision is taken at a step count, never on a timer, so the same settings give the same checkpoint on
one host however loaded. (Accuracy climbs several points per second near the transition, so a time
budget lands somewhere different on every run.) Across hosts the floating-point kernels differ, and the
transition moves by tens of steps (seed 0 of the arithmetic demo: 27.4% at step 290 on one CPU, 17.2%
on another, where 25% comes at step 340), which is why the demo also states the accuracy it starts
from. The demo's settings are measured in docs/benchmarks.md.

`warm_started_model` caches the result by everything that determines it (the tiny model's spec, the
warm-start settings and the data files' contents), so recipes that start from the same checkpoint
train it once.

Single process, plain PyTorch: this runs before the worker groups exist.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hybridflow.data import read_rows
from hybridflow.data.chat import render_prompt
from hybridflow.models.io import load_causal_lm, save_model_dir
from trainer.config import RunConfig
from trainer.model_setup import load_tokenizer, prepare_model_dir

__all__ = [
    "WarmStartConfig",
    "WarmStartResult",
    "cache_miss_reason",
    "file_digest",
    "greedy_accuracy",
    "greedy_answers",
    "warm_start",
    "warm_start_cache_key",
    "warm_start_folder",
    "warm_start_result",
    "warm_started_model",
]

log = logging.getLogger(__name__)

RECORD_FILE = "warm_start.json"


@dataclass(frozen=True)
class WarmStartConfig:
    """How long and how to train.

    Attributes:
        steps: optimizer steps always taken.
        batch_size: sequences per optimizer step, drawn uniformly with replacement.
        lr: AdamW learning rate, constant.
        seed: seed of the batch order.
        eval_every: also measure held-out accuracy every this many steps (0: only at the end); the
            points go into `WarmStartResult.curve` and the log. They do not change the training.
        min_accuracy: after ``steps``, keep training in blocks of ``extend_every`` steps while held-out
            accuracy (fraction) is below this, up to ``max_steps`` in all (0: stop at ``steps``).
        extend_every: steps between held-out checks once past ``steps``.
        max_steps: the most steps taken when extending (a warning says when it stops short).
    """

    steps: int = 290
    batch_size: int = 128
    lr: float = 1e-3
    seed: int = 0
    eval_every: int = 0
    min_accuracy: float = 0.0
    extend_every: int = 10
    max_steps: int = 600

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "extend_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmStartConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"WarmStartConfig.lr must be > 0, got {self.lr}")
        if self.eval_every < 0:
            raise ValueError(f"WarmStartConfig.eval_every must be >= 0, got {self.eval_every}")
        if not 0.0 <= self.min_accuracy <= 1.0:
            raise ValueError(f"WarmStartConfig.min_accuracy must lie in [0, 1], got {self.min_accuracy}")
        if self.max_steps < self.steps:
            raise ValueError(f"WarmStartConfig.max_steps ({self.max_steps}) must be >= steps ({self.steps})")


@dataclass(frozen=True)
class WarmStartResult:
    """What a warm-start reached.

    Attributes:
        accuracy: held-out greedy exact-match accuracy after the last step (fraction).
        seconds: wall time of the training and the measurements.
        steps: optimizer steps taken.
        curve: ``(step, accuracy)`` of every measurement, the last one included.
    """

    accuracy: float
    seconds: float
    steps: int
    curve: tuple[tuple[int, float], ...]


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
def greedy_answers(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict], max_new_tokens: int
) -> list[str]:
    """The model's greedy completion (HF ``generate``, rows left-padded into one batch) of each row's
    chat-rendered prompt: at most ``max_new_tokens`` tokens, decoded without special tokens, stripped;
    in order."""
    prompts, _ = _encode(tokenizer, rows)
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):  # left-padded: every row's continuation starts at ``width``
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    was_training = model.training
    model.eval()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model.train(was_training)
    return [text.strip() for text in tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)]


def greedy_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, rows: Sequence[dict]) -> float:
    """Fraction of ``rows`` whose greedy answer (`greedy_answers`) equals the ground truth exactly."""
    answers = [str(row["reward_model"]["ground_truth"]) for row in rows]
    # One token past the longest answer: room for its end-of-sequence token, nothing more to decode.
    max_new_tokens = max(len(tokenizer.encode(a, add_special_tokens=False)) for a in answers) + 1
    texts = greedy_answers(model, tokenizer, rows, max_new_tokens)
    return sum(t == a for t, a in zip(texts, answers, strict=True)) / len(answers)


def warm_start(
    model_dir: Path,
    tokenizer: PreTrainedTokenizerBase,
    train_rows: Sequence[dict],
    eval_rows: Sequence[dict],
    target_dir: Path,
    config: WarmStartConfig,
) -> WarmStartResult:
    """Train the model in ``model_dir`` on ``train_rows`` (next-token cross-entropy on the answer and its
    end-of-sequence token) for ``config.steps`` steps, and more while its greedy accuracy on ``eval_rows``
    is below ``config.min_accuracy`` (`WarmStartConfig`); save it with its tokenizer to ``target_dir``.

    The same arguments give the same weights: the batch order comes from ``config.seed`` alone.
    """
    # The model is tiny: one thread costs little, and spares the run OpenMP's spin-wait collapse
    # when the cores are shared with other processes (measured: 0.85 s vs 12 s per step).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(model_dir, tokenizer, train_rows, eval_rows, target_dir, config)
    finally:
        torch.set_num_threads(threads)


def _train(
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
    start = time.monotonic()
    curve: list[tuple[int, float]] = []
    step = 0
    while _keep_training(config, step, curve):
        step += 1
        index = torch.randint(len(prompts), (config.batch_size,), generator=generator)
        ids, mask, labels = _training_batch(tokenizer, prompts, answers, index)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if _measure_at(config, step):
            curve.append((step, greedy_accuracy(model, tokenizer, eval_rows)))
            log.warning(
                "warm-start step %d (%.0f s): loss %.3f, held-out accuracy %.3f",
                step, time.monotonic() - start, loss.item(), curve[-1][1],
            )
    if curve[-1][1] < config.min_accuracy:
        log.warning(
            "warm start stopped at max_steps=%d with held-out accuracy %.3f, below min_accuracy %.3f",
            config.max_steps, curve[-1][1], config.min_accuracy,
        )
    save_model_dir(model.eval(), tokenizer, target_dir)
    return WarmStartResult(curve[-1][1], time.monotonic() - start, step, tuple(curve))


def _measure_at(config: WarmStartConfig, step: int) -> bool:
    """Whether held-out accuracy is measured after ``step``: at ``steps``, every ``eval_every``, and
    every ``extend_every`` past ``steps`` while extending."""
    if step == config.steps or (config.eval_every and step % config.eval_every == 0):
        return True
    extending = step > config.steps and config.min_accuracy > 0
    return extending and ((step - config.steps) % config.extend_every == 0 or step == config.max_steps)


def _keep_training(config: WarmStartConfig, step: int, curve: Sequence[tuple[int, float]]) -> bool:
    """Whether to take another step after ``step``: always before ``steps``; after it, only while the
    last measured accuracy is below ``min_accuracy`` and ``max_steps`` is not reached."""
    if step < config.steps:
        return True
    return step < config.max_steps and curve[-1][1] < config.min_accuracy


def warm_start_result(folder: Path) -> WarmStartResult:
    """The `WarmStartResult` recorded in a finished warm-start folder (`warm_started_model`'s checkpoint)."""
    record = json.loads((folder / RECORD_FILE).read_text())
    return WarmStartResult(
        record["accuracy"], record["seconds"], record["steps"], tuple(tuple(point) for point in record["curve"])
    )


def file_digest(paths: Sequence[str]) -> str:
    """SHA-256 (hex) of the files' bytes, in order: the data part of `warm_start_cache_key`."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()


def warm_start_cache_key(run_config: RunConfig, config: WarmStartConfig = WarmStartConfig()) -> dict[str, object]:
    """What determines `warm_started_model`'s checkpoint, by part: ``tiny`` (the tiny model's spec, as
    JSON), ``tokenizer``, ``warm_start`` (``config`` less ``eval_every``, which changes nothing trained),
    and ``train`` and ``val`` (`file_digest` of ``data.train_files`` and ``data.val_files``). Equal keys
    give the same checkpoint; `warm_start_folder` names its folder."""
    data = run_config.data
    return {
        "tiny": json.dumps(asdict(run_config.model.tiny), sort_keys=True),
        "tokenizer": run_config.model.tokenizer,
        "warm_start": {key: value for key, value in asdict(config).items() if key != "eval_every"},
        "train": file_digest(data.train_files),
        "val": file_digest(data.val_files),
    }


def warm_start_folder(cache_dir: Path, key: dict[str, object]) -> Path:
    """``cache_dir/warm_start-<the first 12 hex digits of the key's SHA-256>``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir / f"warm_start-{digest}"


def cache_miss_reason(cache_dir: Path, key: dict[str, object]) -> str:
    """Why ``cache_dir`` holds no finished warm start for ``key``: no finished one at all, an interrupted
    one of this key, or the parts of the key in which the closest finished one differs."""
    folder = warm_start_folder(cache_dir, key)
    if folder.exists():
        return f"{folder} was not finished (no {RECORD_FILE})"
    cached = [json.loads(path.read_text())["key"] for path in sorted(cache_dir.glob(f"warm_start-*/{RECORD_FILE}"))]
    if not cached:
        return f"no finished warm start in {cache_dir}"
    differing = min(([part for part in key if other.get(part) != key[part]] for other in cached), key=len)
    return f"the closest of {len(cached)} cached warm starts in {cache_dir} differs in {', '.join(differing)}"


def warm_started_model(
    run_config: RunConfig, cache_dir: Path, config: WarmStartConfig = WarmStartConfig()
) -> tuple[Path, float]:
    """The warm-started policy of ``run_config`` and its held-out greedy accuracy, trained once and cached.

    Starts from ``run_config``'s tiny model (``model.tiny`` with ``model.tokenizer``, built afresh),
    trains on ``data.train_files`` and measures on ``data.val_files``. The checkpoint lives in
    ``cache_dir/warm_start-<key>`` (`warm_start_cache_key`, `warm_start_folder`): the key hashes the tiny
    model's spec and tokenizer, ``config`` (less ``eval_every``) and the data files' bytes. A folder
    counts only once its record file is written, so an interrupted run trains again. A miss logs a
    warning saying why (`cache_miss_reason`).

    Returns:
        the checkpoint folder (an HF model directory with the tokenizer, for ``model.path``) and its
        held-out greedy accuracy (fraction, HF ``generate``).
    """
    if run_config.model.path is not None:
        raise ValueError(
            f"warm_started_model builds its start from model.tiny; model.path is set ({run_config.model.path})"
        )
    data = run_config.data
    if not data.val_files:
        raise ValueError("warm_started_model measures held-out accuracy on data.val_files, which is empty")
    key = warm_start_cache_key(run_config, config)
    target = warm_start_folder(cache_dir, key)
    record = target / RECORD_FILE
    if record.exists():
        return target, json.loads(record.read_text())["accuracy"]
    log.warning("training a warm start into %s: %s", target, cache_miss_reason(cache_dir, key))
    train = [row for path in data.train_files for row in read_rows(path)]
    held_out = [row for path in data.val_files for row in read_rows(path)]
    # The random start is only an input: built in a scratch folder, so runs of other seeds sharing the
    # cache never overwrite each other's.
    with tempfile.TemporaryDirectory(prefix="warm-start-") as scratch:
        initial = prepare_model_dir(run_config, Path(scratch))
        tokenizer = load_tokenizer(run_config, initial)
        result = warm_start(initial, tokenizer, train, held_out, target, config)
    record.write_text(json.dumps({"key": key, **asdict(result)}, indent=1))
    return target, result.accuracy
