"""Re² (Wang et al., arXiv 2603.07197): the redo phrase, the redo reward and the redo metrics, as pure
functions of strings and tensors.

A response that writes the redo phrase gives up on its current attempt: it is cut right after the phrase
(an end-of-sequence token follows), and at test time the question is asked again from scratch. A redo is
worth what restarting is worth: with ``P_c`` and ``P_r`` the frequencies of a correct answer and of a
redo when the question is attempted afresh, and at most ``R`` attempts,

    E[reward of a redo] = P_c * (1 + P_r + ... + P_r^(R-1)) = P_c * (1 - P_r^R) / (1 - P_r).

Both frequencies come from the continuations of the query's *other* prefix groups, so a group's own
samples never set their own reward; when every one of those is itself a redo, a redo gets -1 (restarting
leads nowhere).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

__all__ = [
    "REDO_PHRASE",
    "cut_after_phrase",
    "is_redo",
    "phrase_end_token",
    "redo_metrics",
    "redo_rewards",
    "restart_outcomes",
]

REDO_PHRASE = "It's better to redo the question."
"""The phrase the prompt offers the model for giving up (the paper's wording)."""


def cut_after_phrase(text: str, phrase: str = REDO_PHRASE) -> str:
    """``text`` up to and including the first ``phrase``; ``text`` unchanged when the phrase is absent."""
    at = text.find(phrase)
    return text if at < 0 else text[: at + len(phrase)]


def is_redo(text: str, phrase: str = REDO_PHRASE, answer_pattern: str = r"\d") -> bool:
    """Whether ``text`` is a redo: it holds ``phrase`` and no final answer (a match of the regular
    expression ``answer_pattern``) follows the last occurrence of it."""
    at = text.rfind(phrase)
    return at >= 0 and re.search(answer_pattern, text[at + len(phrase) :]) is None


def phrase_end_token(
    tokens: Sequence[int], decode: Callable[[list[int]], str], phrase: str = REDO_PHRASE
) -> int | None:
    """The number of leading ``tokens`` whose text first contains ``phrase`` (the response is cut there),
    or ``None`` when the whole text does not contain it.

    Containment only grows with the token count, so a bisection finds it in ``log2(len(tokens))`` decodes
    whatever the tokenizer (a phrase may end inside a multi-character token).
    """
    tokens = list(tokens)
    if phrase not in decode(tokens):
        return None
    low, high = 0, len(tokens)  # decode(tokens[:low]) lacks the phrase, decode(tokens[:high]) has it
    while high - low > 1:
        middle = (low + high) // 2
        if phrase in decode(tokens[:middle]):
            high = middle
        else:
            low = middle
    return high


def redo_rewards(correct: Tensor, redo: Tensor, group_ids: Tensor, rounds: int = 5) -> Tensor:
    """The Re² reward of each continuation.

    Args:
        correct: ``[batch]`` bool, the sample's answer is right (ignored where ``redo``).
        redo: ``[batch]`` bool, the sample is a redo (`is_redo`).
        group_ids: ``[batch, 2]`` int, (query id, prefix id within the query); a prefix group is the
            rows whose two ids are equal.
        rounds: ``R``, the most attempts a redo is credited with.

    Returns:
        ``[batch]`` float32: 1 for a correct answer, 0 for a wrong one; for a redo
        ``P_c * (1 - P_r^R) / (1 - P_r)`` with ``P_c`` and ``P_r`` the frequencies of correct
        (non-redo) answers and of redos over the rows of the same query outside the row's prefix group,
        and -1 when all of those are redos.

    Raises:
        ValueError: on mismatched shapes, or a redo whose query has no row outside its prefix group.
    """
    if group_ids.dim() != 2 or group_ids.shape[1] != 2:
        raise ValueError(f"group_ids must be [batch, 2] (query, prefix), got shape {tuple(group_ids.shape)}")
    if not correct.shape == redo.shape == group_ids.shape[:1]:
        raise ValueError(
            f"correct {tuple(correct.shape)}, redo {tuple(redo.shape)} and group_ids "
            f"{tuple(group_ids.shape)} must have the same number of rows"
        )
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    redo = redo.bool()
    right = correct.bool() & ~redo
    query, prefix = group_ids[:, 0], group_ids[:, 1]
    # [batch, batch]: row j counts for row i when it answers the same query from another prefix.
    outside = (query[:, None] == query[None, :]) & (prefix[:, None] != prefix[None, :])
    count = outside.sum(dim=1).double()
    lacking = redo & (count == 0)
    if lacking.any():
        rows = torch.nonzero(lacking).flatten().tolist()
        raise ValueError(f"redo rows {rows} have no continuation of another prefix of their query")
    p_correct = (outside.double() @ right.double()) / count.clamp(min=1)
    p_redo = (outside.double() @ redo.double()) / count.clamp(min=1)
    all_redo = p_redo >= 1.0
    # sum_{k<R} p^k, written so that p -> 1 needs no special case until p == 1 exactly.
    retries = torch.stack([p_redo**k for k in range(rounds)]).sum(dim=0)
    redo_value = torch.where(all_redo, torch.full_like(p_correct, -1.0), p_correct * retries)
    return torch.where(redo, redo_value, right.double()).float()


def redo_metrics(correct: Tensor, redo: Tensor, prefix: str = "re2") -> dict[str, float]:
    """``{prefix}/redo_rate`` (fraction of samples that are redos), ``{prefix}/expected_rounds``
    (attempts per question at test time when a redo is asked again: ``1 / (1 - redo_rate)``, infinite
    when every sample is a redo) and ``{prefix}/accuracy_non_redo`` (correct among the samples that
    answer; NaN when none does). ``correct`` and ``redo`` are ``[batch]`` bool."""
    redo = redo.bool()
    rate = redo.double().mean().item()
    answered = ~redo
    accuracy = (
        (correct.bool() & answered).sum().item() / answered.sum().item() if answered.any() else math.nan
    )
    return {
        f"{prefix}/redo_rate": rate,
        f"{prefix}/expected_rounds": math.inf if rate >= 1.0 else 1.0 / (1.0 - rate),
        f"{prefix}/accuracy_non_redo": accuracy,
    }


def redo_after_prefixes(
    redo: Tensor, source_correct: Tensor, source_redo: Tensor, prefix_lengths: Tensor, prefix: str
) -> dict[str, float]:
    """Whether redo is selective: the redo rate of continuations after a right prefix (cut from a first-stage
    sample that was correct) and after a wrong one (cut from a sample that answered wrongly), as
    ``{prefix}/redo_after_right_prefix`` and ``{prefix}/redo_after_wrong_prefix`` (NaN where there is no such
    continuation). Empty prefixes and prefixes of samples that were themselves redos count in neither.
    Every argument is ``[continuations]``: bool flags, and ``prefix_lengths`` in tokens."""
    cut = (prefix_lengths > 0) & ~source_redo.bool()
    rates = {}
    for name, rows in (("right", cut & source_correct.bool()), ("wrong", cut & ~source_correct.bool())):
        rates[f"{prefix}/redo_after_{name}_prefix"] = redo[rows].double().mean().item() if rows.any() else math.nan
    return rates


def restart_outcomes(
    correct: Tensor, redo: Tensor, attempt: Callable[[Tensor, int], tuple[Tensor, Tensor]], restarts: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The test-time restart loop: a question whose answer is a redo is asked again, up to ``restarts``
    times.

    Args:
        correct, redo: ``[batch]`` bool, the first attempt's flags (a redo is never correct).
        attempt: ``attempt(rows, k) -> (correct, redo)`` answers the questions of ``rows`` (``[r]`` int64
            indices into the batch) afresh for restart ``k`` (1-based); returns ``[r]`` bool flags.
        restarts: how many times a redo may be asked again (0: the first attempt stands).

    Returns:
        ``(correct, redo, attempts)``, each ``[batch]``: the last attempt's flags (a question still
        redoing after the last restart counts as not correct) and how many attempts it took (int64,
        ``1 .. restarts + 1``).
    """
    if restarts < 0:
        raise ValueError(f"restarts must be >= 0, got {restarts}")
    correct, redo = correct.bool().clone(), redo.bool().clone()
    attempts = torch.ones(len(correct), dtype=torch.long)
    for k in range(1, restarts + 1):
        rows = torch.nonzero(redo).flatten()
        if not len(rows):
            break
        again_correct, again_redo = attempt(rows, k)
        correct[rows], redo[rows] = again_correct.bool() & ~again_redo.bool(), again_redo.bool()
        attempts[rows] += 1
    return correct & ~redo, redo, attempts
