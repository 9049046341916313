"""The Batch contract: which columns a step reads and writes, checked where the data moves.

Worker methods declare theirs in ``@register(reads=..., writes=...)`` and the worker group checks them on
the controller, before anything is sent and after the results come back. Controller steps declare theirs
with `step_columns`. Either way a missing column is a `MissingColumnError` that names the step and the
column, instead of a ``KeyError`` deep inside a worker.

The standard columns' names and meanings live here too (`COLUMNS`), so that controller steps and
workers name them from one place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch

from hybridflow.protocol import Batch

__all__ = [
    "ADVANTAGES",
    "COLUMNS",
    "LOG_PROB_COLUMNS",
    "LOSS_MASK",
    "MODEL_INPUTS",
    "PROMPT_INPUTS",
    "RESPONSE_INPUTS",
    "SAMPLED_MASK",
    "TOKEN_VERSIONS",
    "MissingColumnError",
    "first_batch",
    "loss_response_mask",
    "loss_view",
    "require_columns",
    "sampled_response_mask",
    "step_columns",
]

F = TypeVar("F", bound=Callable[..., Any])

COLUMNS: dict[str, str] = {
    "input_ids": "[rows, prompt_len] int64: prompt tokens, left-padded",
    "attention_mask": "[rows, prompt_len] int64: 1 on the prompt's tokens, 0 on its padding",
    "responses": "[rows, response_len] int64: sampled response tokens, right-padded",
    "response_mask": "[rows, response_len] int64: 1 on the response's tokens, 0 on its padding",
    "response_lengths": "[rows] int64: valid response tokens per row",
    "rollout_log_probs": "[rows, response_len] float: the rollout engine's log-probs of the sampled tokens (nats)",
    "old_log_probs": "[rows, response_len] float: the current policy's log-probs before the update (nats)",
    "ref_log_probs": "[rows, response_len] float: the frozen reference policy's log-probs (nats)",
    "teacher_log_probs": "[rows, response_len] float: a frozen teacher model's log-probs of the sampled response "
    "tokens (nats; on-policy distillation, docs/distillation.md)",
    "values": "[rows, response_len] float: the critic's value at each response position",
    "scores": "[rows] float: each response's score",
    "token_level_scores": "[rows, response_len] float: the score at the last valid response token, 0 elsewhere",
    "token_level_rewards": "[rows, response_len] float: the token rewards after shaping and an in-reward KL",
    "advantages": "[rows, response_len] float: the advantage of each response token",
    "returns": "[rows, response_len] float: the return of each response token (the critic's target)",
    "loss_mask": "[rows, response_len] float: each response token's actor loss weight, finite and >= 0 "
    "(0 = no loss, 1 = as without the column); multiplies every actor loss term of the token, while the "
    "token counts count the tokens of non-zero weight; multiplied into response_mask for the loss "
    "(`loss_response_mask`), not for the forward",
    "sampled_mask": "[rows, response_len] int64: 1 on the response tokens the rollout engine sampled (those with "
    "a rollout_log_probs entry), 0 on ids a step inserted (an episode's observations) and on padding; without "
    "the column every response token was sampled (`sampled_response_mask`)",
    "policy_version": "[rows] int64: the policy version (actor updates applied) of the weights the rollout engine "
    "sampled the row with; written by an engine in a rollout pool of its own (docs/rollout_service.md)",
    "token_versions": "[rows, response_len] int64: the policy version of the weights that sampled each response "
    "token, 0 on padding; written by partial rollouts (async_rollout.partial_round_tokens), where a sample "
    "paused and continued on newer weights holds tokens of several versions (docs/rollout_service.md)",
    "group_ids": "[rows] int64: the prompt each row answers (rows of one prompt share it)",
    "response_text": "non-tensor: each row's decoded response",
}
"""The standard columns of a rollout Batch: name -> shape, dtype and meaning. A recipe may add its own."""

PROMPT_INPUTS = ("input_ids", "attention_mask")
"""The prompt columns a generation reads."""
RESPONSE_INPUTS = ("responses", "response_mask")
"""The response columns a generation writes and a training-layout forward reads."""
MODEL_INPUTS = (*PROMPT_INPUTS, *RESPONSE_INPUTS)
"""The columns every training-layout forward reads: prompt and response tokens and their masks."""
LOG_PROB_COLUMNS = ("old_log_probs", "ref_log_probs", "rollout_log_probs")
"""The per-token log-prob columns (nats) a policy loss may read."""
ADVANTAGES = "advantages"
LOSS_MASK = "loss_mask"
SAMPLED_MASK = "sampled_mask"
TOKEN_VERSIONS = "token_versions"


class MissingColumnError(KeyError, ValueError):
    """A step was given a Batch without a column it reads, or returned one without a column it writes."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def require_columns(batch: Batch, columns: Iterable[str], step: str, *, produced: bool = False) -> None:
    """Raise `MissingColumnError` naming ``step`` and every column of ``columns`` that ``batch`` lacks.

    ``produced`` words the message for a step's output rather than its input.
    """
    missing = [column for column in columns if column not in batch]
    if not missing:
        return
    what = "returned no column" if produced else "needs column"
    plural = "s" if len(missing) > 1 else ""
    raise MissingColumnError(
        f"{step} {what}{plural} {', '.join(repr(c) for c in missing)}; "
        f"the batch has: {', '.join(sorted(batch.keys())) or '(no columns)'}"
    )


def first_batch(args: tuple, kwargs: dict) -> Batch | None:
    """The first `Batch` among a call's positional, then keyword, arguments (``None`` if there is none)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Batch):
            return value
    return None


def step_columns(*, reads: Iterable[str] = (), writes: Iterable[str] = ()) -> Callable[[F], F]:
    """Declare the columns a controller step reads from its first Batch argument and writes to the Batch
    it returns (or to the first element of a returned tuple).

    The declaration is checked on every call and kept on the function as ``reads`` and ``writes``::

        @step_columns(reads=("scores", "group_ids"), writes=("advantages",))
        def group_advantages(rollouts: Batch) -> Batch: ...
    """
    reads, writes = tuple(reads), tuple(writes)

    def decorate(fn: F) -> F:
        name = fn.__name__

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            batch = first_batch(args, kwargs)
            if batch is not None:
                require_columns(batch, reads, name)
            result = fn(*args, **kwargs)
            output = result[0] if isinstance(result, tuple) else result
            if isinstance(output, Batch):
                require_columns(output, writes, name, produced=True)
            return result

        checked.reads, checked.writes = reads, writes  # type: ignore[attr-defined]
        return checked  # type: ignore[return-value]

    return decorate


def sampled_response_mask(batch: Batch) -> torch.Tensor:
    """``[rows, response_len]`` bool: the response tokens the rollout engine sampled: ``response_mask``,
    and ``sampled_mask`` when the batch has one.

    The engine-against-trainer log-prob gap, the rollout correction's importance ratios and the
    entropy estimate from ``rollout_log_probs`` run over these tokens. They are not the loss weights
    (``loss_mask``): a step may give a sampled token weight 0 (a top-entropy mask), and an inserted
    token has no engine log-prob whatever its weight.

    Raises:
        ValueError: naming ``sampled_mask``, when its shape is not ``response_mask``'s.
    """
    mask = batch["response_mask"].bool()
    if SAMPLED_MASK not in batch:
        return mask
    return mask & _response_shaped(batch, SAMPLED_MASK).bool()


def _response_shaped(batch: Batch, column: str) -> torch.Tensor:
    """``batch[column]``, refused naming ``column`` when its shape is not ``response_mask``'s."""
    values, shape = batch[column], batch["response_mask"].shape
    if values.shape != shape:
        raise ValueError(f"column {column!r} has shape {tuple(values.shape)}; it must be response_mask's {tuple(shape)}")
    return values


def loss_response_mask(batch: Batch) -> torch.Tensor:
    """``[rows, response_len]``: each response token's actor loss weight: ``response_mask``, times
    ``loss_mask`` when the batch has one (a step's per-token weights; 0/1 is a mask: 1 = train, 0 = no
    loss), 0 on padding whatever ``loss_mask`` holds there.

    Every actor loss term multiplies a token's loss by its weight, and every token count counts the
    tokens of non-zero weight (`hybridflow.algos.aggregation`), so a 0/1 ``loss_mask`` gives the
    loss of its tokens exactly and an all-1 one the loss without the column. The result is
    ``response_mask`` itself without ``loss_mask``, else of ``loss_mask``'s floating dtype.

    Raises:
        ValueError: naming ``loss_mask``, when its shape is not ``response_mask``'s, or when a response
            token's weight is negative, inf or nan (the message names the first such row and position).
    """
    mask = batch["response_mask"]
    if LOSS_MASK not in batch:
        return mask
    weights = _response_shaped(batch, LOSS_MASK)
    if not weights.is_floating_point():
        weights = weights.float()
    valid = mask.bool()
    bad = valid & ~(torch.isfinite(weights) & (weights >= 0))
    if bool(bad.any()):
        row, position = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"column {LOSS_MASK!r} must hold a finite weight >= 0 on every response token; row {row} holds "
            f"{weights[row, position].item()} at response position {position}"
        )
    return torch.where(valid, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))


def loss_view(batch: Batch) -> Batch:
    """The batch an actor loss reads: with a ``loss_mask``, ``response_mask`` becomes the per-token loss
    weights (`loss_response_mask`) and ``sampled_mask`` the tokens the engine sampled
    (`sampled_response_mask`); without one, ``batch`` itself.

    The model's forward runs on the real ``response_mask`` before this; every loss term then weighs a
    token by its weight, while the rollout correction's importance ratios keep every sampled token
    (`workers.objective.PolicyObjective` reads ``sampled_mask`` when the batch has one).
    """
    if LOSS_MASK not in batch:
        return batch
    rest = batch.select(*[column for column in batch.keys() if column not in ("response_mask", SAMPLED_MASK)])
    weights = loss_response_mask(batch)
    return rest | Batch({"response_mask": weights, SAMPLED_MASK: sampled_response_mask(batch).long()})
