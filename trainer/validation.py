"""Validation: answers to every held-out prompt, decoded and scored as the training steps score.

`validate` is the configured validation that `trainer.fit.fit` runs by default; `validation_rollouts`
is its loop, which a recipe reuses with its own sampling or its own treatment of the answers (Re²'s
redo validation cuts each answer after its redo phrase before scoring)::

    for rollouts in validation_rollouts(runtime, sampling, finish=cut_after_phrase):
        ...  # rows with response_text, scores, token_level_scores
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch

from hybridflow.data import PromptLoader
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from trainer.runtime import Runtime
from trainer.steps import decode_responses, reward_scores, sampling_from
from trainer.weight_sync import push_weights

__all__ = ["Finish", "validate", "validation_metrics", "validation_rollouts", "validation_sampling"]

Finish = Callable[[Runtime, Batch], Batch]
"""``finish(runtime, rollouts) -> rollouts``: what happens to the engine's answers before scoring; it
returns them with ``response_text``."""


def validation_sampling(runtime: Runtime) -> SamplingParams:
    """The configured validation sampling (``rollout.val_sampling``; greedy by default), up to
    ``data.max_response_length`` new tokens, seeded with ``rollout.seed``."""
    rollout = runtime.config.rollout
    return sampling_from(rollout.val_sampling, runtime, rollout.seed)


def _decoded(runtime: Runtime, rollouts: Batch) -> Batch:
    return rollouts | decode_responses(rollouts, runtime.tokenizer)


def validation_rollouts(
    runtime: Runtime, sampling: SamplingParams | None = None, finish: Finish = _decoded
) -> Iterator[Batch]:
    """Every validation prompt's answers, one batch of ``data.val_batch_size`` prompts at a time, in file
    order: ``sampling.n`` rows per prompt (default sampling: `validation_sampling`), passed through
    ``finish`` (default: decode ``response_text``), then scored (`trainer.steps.reward_scores`: ``scores``,
    ``token_level_scores`` and, with a reward model, ``rule_scores`` and ``rm_scores``)."""
    if runtime.val_data is None:
        raise ValueError("validation needs held-out prompts: data.val_files is empty")
    sampling = sampling or validation_sampling(runtime)
    loader = PromptLoader(
        runtime.val_data,
        runtime.config.data.val_batch_size,
        runtime.tokenizer.pad_token_id,
        shuffle=False,
        drop_last=False,
    )
    if runtime.rollout is not runtime.actor:
        push_weights(runtime.actor, runtime.rollout)  # a rollout pool of its own serves the weights validated
    for prompts in loader:
        rollouts = finish(runtime, runtime.rollout.generate_sequences(prompts, sampling))
        scored, _ = reward_scores(runtime, rollouts)
        yield rollouts | scored


def validate(runtime: Runtime) -> dict[str, float]:
    """The configured validation over every held-out prompt: `validation_metrics` of
    `validation_rollouts`."""
    return validation_metrics(validation_rollouts(runtime))


def validation_metrics(batches: Iterable[Batch]) -> dict[str, float]:
    """Accuracy, mean score and length over the scored validation ``batches``.

    ``val/accuracy`` is the share of rows whose reward-function score is at least 1 (the reward model's
    score does not count towards it); ``val/score_mean`` is the mean of the scores the training steps
    use, the reward model's included (and then ``val/model_score_mean``); ``val/response_length_mean``
    is in tokens; ``val/samples`` counts the rows.
    """
    scores, rule_scores, rm_scores, lengths = [], [], [], []
    for rollouts in batches:
        scores.append(rollouts["scores"])
        rule_scores.append(rollouts["rule_scores"] if "rule_scores" in rollouts else rollouts["scores"])
        if "rm_scores" in rollouts:
            rm_scores.append(rollouts["rm_scores"])
        lengths.append(rollouts["response_lengths"].float())
    score = torch.cat(scores)
    metrics = {
        "val/accuracy": (torch.cat(rule_scores) >= 1.0).float().mean().item(),
        "val/score_mean": score.mean().item(),
        "val/response_length_mean": torch.cat(lengths).mean().item(),
        "val/samples": float(len(score)),
    }
    if rm_scores:
        metrics["val/model_score_mean"] = torch.cat(rm_scores).mean().item()
    return metrics
