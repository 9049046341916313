"""Re² (Wang et al., ICLR 2026, arXiv 2603.07197): reinforcement learning with re-solving, as one step
function under `fit`.

The model may give up on an attempt by writing "It's better to redo the question."; the response is cut
right after the phrase and ends there. One step, as the paper's algorithm box reads:

    1. draw n full samples per query (cut after the redo phrase);
    2. cut each at a random ratio (0 with probability 0.3, else uniform in [0, 0.8]) and move the prefix
       into the prompt (it carries no loss);
    3. draw m continuations per prefix; each prefix is a group, ids (query, prefix);
    4. reward: 1 correct, 0 wrong, a redo P_c (1 - P_r^R) / (1 - P_r) from the query's other prefix
       groups, -1 when all of those redo (re2_redo.py);
    5. dynamic sampling: keep the prefix groups whose rewards are not all equal, refill from new queries;
    6. advantage normalised within the prefix group; DAPO's loss (clip 0.2/0.28, dual clip 10,
       token-mean, no KL; config.yaml).

Run:  python -m recipes.re2.main [key=value overrides of config.yaml]
(or python recipes/re2/main.py ...)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.algos import group_index
from hybridflow.algos.masked import last_valid_token_mask
from hybridflow.protocol import Batch
from hybridflow.rollout.sampling import SamplingParams
from recipes.re2.re2_prefixes import (
    cap_lengths,
    continuation_prompts,
    cut_after_redo,
    cut_lengths,
    prefix_token_lists,
)
from recipes.re2.re2_redo import (
    REDO_PHRASE,
    is_redo,
    redo_after_prefixes,
    redo_metrics,
    redo_rewards,
    restart_outcomes,
)
from recipes.re2.re2_task import ensure_task, instructed_copy
from trainer.config import RunConfig, load_config, recipe_field, recipe_settings
from trainer.fit import Progress, fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.steps import (
    advantages,
    concat_rollouts,
    generate,
    old_log_probs,
    reward_scores,
    sampling_params,
    score,
    update_actor,
)
from trainer.validation import validate, validation_rollouts, validation_sampling

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/re2/data")  # config.yaml's data.train_files / val_files point here


@dataclass(frozen=True)
class Re2Settings:
    """``recipe.*`` keys (README.md)."""

    continuations: int = recipe_field(8, ge=1)  # m, per prefix; rollout.n is the n full samples
    zero_cut_prob: float = recipe_field(0.3, ge=0, le=1)
    max_cut_ratio: float = recipe_field(0.8, ge=0, le=1)
    redo_rounds: int = recipe_field(5, ge=1)  # R
    max_rounds: int = recipe_field(4, ge=1)  # generation rounds per step (dynamic sampling)
    redo_phrase: str = REDO_PHRASE
    answer_pattern: str = r"\d"  # what counts as a final answer after the phrase
    instruction: bool = False  # tell the model about the phrase in a system message (re2_task.py)
    val_temperature: float = recipe_field(0.6, gt=0)  # the paper's evaluation temperature
    val_restarts: int = recipe_field(4, ge=0)  # a redo is asked again up to this many times (R - 1)
    val_samples: int = recipe_field(4, ge=1)  # sampled answers per held-out prompt in redo_validation


def as_written(tokenizer: PreTrainedTokenizerBase, settings: Re2Settings) -> Re2Settings:
    """``settings`` with the redo phrase as the policy's ``tokenizer`` writes it (the decoding of its
    encoding): the text its samples can hold. A tokenizer that drops characters it cannot encode writes
    the phrase without them."""
    ids = tokenizer.encode(settings.redo_phrase, add_special_tokens=False)
    return replace(settings, redo_phrase=tokenizer.decode(ids, skip_special_tokens=True))


def call_seed(runtime: Runtime, round_index: int, stage: int) -> int:
    """A sampling seed per (step, round, stage): the two stages never share random numbers, and a resumed
    run samples what the uninterrupted one did."""
    key = [runtime.config.rollout.seed, runtime.step, round_index, stage]
    return int(np.random.SeedSequence(key).generate_state(1)[0] % 2**31)


def with_columns(rollouts: Batch, columns: Batch) -> Batch:
    """``rollouts`` with ``columns`` replacing the columns of the same names."""
    return rollouts.select(*[k for k in rollouts.keys() if k not in columns]) | columns


def ended_at_redo(runtime: Runtime, rollouts: Batch, phrase: str) -> Batch:
    """Responses cut right after the redo phrase, EOS appended, ``response_text`` the whole sample's text
    (prefix, then response)."""
    tokenizer = runtime.tokenizer

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    cut = with_columns(
        rollouts, cut_after_redo(rollouts, decode, tokenizer.eos_token_id, tokenizer.pad_token_id, phrase)
    )
    prefixes = cut["prefix_tokens"] if "prefix_tokens" in cut else torch.zeros(len(cut), 0, dtype=torch.long)
    lengths = cut["prefix_lengths"] if "prefix_lengths" in cut else torch.zeros(len(cut), dtype=torch.long)
    texts = [
        decode(prefix[: int(k)].tolist() + response[mask.bool()].tolist())
        for prefix, k, response, mask in zip(
            prefixes, lengths, cut["responses"], cut["response_mask"], strict=True
        )
    ]
    return with_columns(cut, Batch(non_tensors={"response_text": texts}))


def judged(runtime: Runtime, rollouts: Batch, settings: Re2Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """``(correct, redo)``, each ``[batch]`` bool: exact match of the whole sample (a redo is never
    correct, whatever digits came before its phrase) and `is_redo`."""
    return answer_flags(rollouts | score(runtime, rollouts), settings)


def rewarded(runtime: Runtime, rollouts: Batch, settings: Re2Settings, group_ids: torch.Tensor) -> Batch:
    """``correct``, ``redo``, ``group_ids`` and the Re² reward as ``scores`` and ``token_level_scores``
    (at the last response token)."""
    correct, redo = judged(runtime, rollouts, settings)
    reward = redo_rewards(correct, redo, group_ids, settings.redo_rounds)
    last = last_valid_token_mask(rollouts["response_mask"].bool())
    return Batch(
        {
            "scores": reward,
            "token_level_scores": last.float() * reward[:, None],
            "correct": correct,
            "redo": redo,
            "group_ids": group_ids,
        }
    )


def two_stage_rollout(
    runtime: Runtime, queries: Batch, settings: Re2Settings, round_index: int
) -> tuple[Batch, Batch]:
    """Steps 1-4 for one batch of queries: ``len(queries) * n * m`` rewarded continuations, rows ordered
    query, prefix, continuation, with ``group_ids [rows, 2]`` = (query in this round, prefix) and the flags of
    the first-stage sample each prefix was cut from (``source_correct``, ``source_redo``); and the
    ``correct`` and ``redo`` flags of the ``len(queries) * n`` first-stage samples."""
    n, m = runtime.config.rollout.n, settings.continuations
    limit = runtime.config.data.max_response_length
    pad = runtime.tokenizer.pad_token_id
    full = generate(
        runtime, queries, replace(sampling_params(runtime), seed=call_seed(runtime, round_index, 1))
    )
    full = ended_at_redo(runtime, full, settings.redo_phrase)
    correct, redo = judged(runtime, full, settings)

    cuts = cut_lengths(
        full["response_lengths"],
        torch.Generator().manual_seed(call_seed(runtime, round_index, 2)),
        settings.zero_cut_prob,
        settings.max_cut_ratio,
    )
    prompts = continuation_prompts(
        full.select(*queries.keys()), prefix_token_lists(full["responses"], cuts), pad, prefix_width=limit
    )
    longest = int(prompts["attention_mask"].sum(dim=1).max())
    if longest > runtime.config.data.max_prompt_length:
        raise ValueError(
            f"a continuation prompt (question + prefix) has {longest} tokens, more than "
            f"data.max_prompt_length={runtime.config.data.max_prompt_length}; raise it to at least the "
            f"longest question + recipe.max_cut_ratio x data.max_response_length"
        )
    sampling = replace(sampling_params(runtime), n=m, seed=call_seed(runtime, round_index, 3))
    rollouts = generate(runtime, prompts, sampling)
    generated = int(full["response_lengths"].sum() + rollouts["response_lengths"].sum())
    rollouts = with_columns(rollouts, cap_lengths(rollouts, limit - rollouts["prefix_lengths"], pad))
    rollouts = ended_at_redo(runtime, rollouts, settings.redo_phrase)
    rows = torch.arange(len(rollouts)) // m  # the full sample (= prefix) each continuation comes from
    group_ids = torch.stack([round_index * len(queries) + rows // n, rows % n], dim=1)
    rollouts = with_columns(rollouts, rewarded(runtime, rollouts, settings, group_ids))
    rollouts = with_columns(rollouts, Batch({"source_correct": correct[rows], "source_redo": redo[rows]}))
    runtime.record({"re2/generated_tokens": runtime.step_metrics.get("re2/generated_tokens", 0) + generated})
    return rollouts, Batch({"correct": correct, "redo": redo})


def informative(rollouts: Batch) -> Batch:
    """The rows of prefix groups whose rewards are not all equal (equal rewards give zero advantage)."""
    index, count = group_index(rollouts["group_ids"])
    scores = rollouts["scores"].double()
    high = torch.full((count,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amax")
    low = torch.full((count,), torch.inf, dtype=torch.float64).scatter_reduce(0, index, scores, "amin")
    return rollouts[torch.nonzero((high > low)[index]).flatten()]


def with_trainer_log_prob_at_appended_eos(rollouts: Batch) -> Batch:
    """``rollout_log_probs`` taking ``old_log_probs`` at the appended EOS tokens: the engine never sampled
    them and has no log-prob for them, so the sync check (engine vs trainer) covers the sampled tokens
    only."""
    appended = rollouts["appended_eos"]
    engine = rollouts["rollout_log_probs"]
    return with_columns(
        rollouts, Batch({"rollout_log_probs": torch.where(appended, rollouts["old_log_probs"], engine)})
    )


def re2_step(runtime: Runtime, prompts: Batch) -> Batch:
    """One Re² step: two-stage rollouts until the batch holds ``train_batch_size * n`` informative prefix
    groups (or ``max_rounds`` rounds ran), then one DAPO update with advantages within prefix groups."""
    settings = as_written(runtime.tokenizer, recipe_settings(runtime.config, Re2Settings))
    wanted = len(prompts) * runtime.config.rollout.n * settings.continuations
    kept: list[Batch] = []
    first: list[Batch] = []
    continuations: list[Batch] = []
    rounds = 0
    while rounds < settings.max_rounds and sum(len(b) for b in kept) < wanted:
        queries = prompts if rounds == 0 else runtime.next_prompts()
        rollouts, samples = two_stage_rollout(runtime, queries, settings, rounds)
        first.append(samples)
        continuations.append(rollouts.select("correct", "redo", "source_correct", "source_redo", "prefix_lengths"))
        kept.append(informative(rollouts))
        rounds += 1
    sampled, fresh = Batch.concat(continuations), Batch.concat(first)
    kept_rows = sum(len(b) for b in kept)
    runtime.record(
        {
            **redo_metrics(fresh["correct"], fresh["redo"], "re2"),  # the policy from scratch
            **redo_metrics(sampled["correct"], sampled["redo"], "re2/continuation"),
            **redo_after_prefixes(
                sampled["redo"],
                sampled["source_correct"],
                sampled["source_redo"],
                sampled["prefix_lengths"],
                "re2/continuation",
            ),
            "re2/rounds": float(rounds),
            "re2/prefix_groups_kept": float(min(kept_rows, wanted) // settings.continuations),
            "re2/kept_fraction": kept_rows / len(sampled),
        }
    )
    if not kept_rows:  # every prefix group had equal rewards in every round: nothing to learn this step
        return prompts
    rollouts = concat_rollouts([b for b in kept if len(b)], runtime.tokenizer.pad_token_id)[:wanted]
    rollouts = with_trainer_log_prob_at_appended_eos(rollouts | old_log_probs(runtime, rollouts))
    rollouts |= advantages(runtime, rollouts)  # GRPO within the finest group: (query, prefix)
    update_actor(runtime, rollouts)  # DAPO: clip 0.2/0.28, dual clip 10, token-mean, no KL
    return rollouts


def redo_validation(runtime: Runtime, settings: Re2Settings, samples: int) -> dict[str, float]:
    """Sampled answers to every held-out prompt (``samples`` per prompt at ``recipe.val_temperature``),
    cut after the redo phrase, through the configured validation's loop
    (`trainer.validation.validation_rollouts`), with the paper's test-time restarts: a redo is asked again,
    afresh, up to ``recipe.val_restarts`` times.

    Returns ``val_re2/redo_rate``, ``expected_rounds`` and ``accuracy_non_redo`` of the first attempts;
    ``val_re2/accuracy_first_attempt`` (a redo counts as wrong), ``val_re2/accuracy_restarts`` (the last
    attempt's answer; a question still redoing after the last restart counts as wrong),
    ``val_re2/attempts_mean`` and ``val_re2/unanswered_rate`` (still redoing after the last restart).
    """
    settings = as_written(runtime.tokenizer, settings)
    sampling = replace(
        validation_sampling(runtime), n=samples, temperature=settings.val_temperature, top_p=1.0, top_k=-1
    )

    def cut(runtime: Runtime, rollouts: Batch) -> Batch:
        return ended_at_redo(runtime, rollouts, settings.redo_phrase)

    first: list[torch.Tensor] = []
    redo_first: list[torch.Tensor] = []
    final: list[torch.Tensor] = []
    unanswered: list[torch.Tensor] = []
    attempts: list[torch.Tensor] = []
    for batch_index, rollouts in enumerate(validation_rollouts(runtime, sampling, finish=cut)):
        correct, redo = answer_flags(rollouts, settings)
        first.append(correct)
        redo_first.append(redo)
        attempt = asked_again(runtime, rollouts, replace(sampling, n=1), settings, batch_index)
        last_correct, last_redo, tries = restart_outcomes(correct, redo, attempt, settings.val_restarts)
        final.append(last_correct)
        unanswered.append(last_redo)
        attempts.append(tries)
    return {
        **redo_metrics(torch.cat(first), torch.cat(redo_first), "val_re2"),
        "val_re2/accuracy_first_attempt": torch.cat(first).double().mean().item(),
        "val_re2/accuracy_restarts": torch.cat(final).double().mean().item(),
        "val_re2/attempts_mean": torch.cat(attempts).double().mean().item(),
        "val_re2/unanswered_rate": torch.cat(unanswered).double().mean().item(),
    }


RESPONSE_SIDE_COLUMNS = frozenset(
    {
        "responses",
        "response_mask",
        "rollout_log_probs",
        "response_lengths",
        "finish_reason",
        "response_text",
        "appended_eos",
        "scores",
        "token_level_scores",
        "rule_scores",
        "rm_scores",
        "reward_status",
        "policy_version",
    }
)
"""Columns of a validation rollout that belong to its answer, not to its prompt: a restart keeps the
rest (the prompt's ids, ground truth, data source) and samples a new answer."""


def answer_flags(rollouts: Batch, settings: Re2Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """``(correct, redo)``, each ``[batch]`` bool, of scored answers with ``response_text``."""
    redo = torch.tensor(
        [is_redo(t, settings.redo_phrase, settings.answer_pattern) for t in rollouts["response_text"]]
    )
    return (rollouts["scores"] >= 1.0) & ~redo, redo


def asked_again(
    runtime: Runtime, rollouts: Batch, sampling: SamplingParams, settings: Re2Settings, batch_index: int
) -> Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]:
    """``attempt(rows, k)`` for `restart_outcomes`: the questions of ``rows`` of the validation batch
    ``rollouts`` answered afresh (one sample each, ``sampling`` with restart ``k``'s seed), cut after
    the redo phrase, scored; returns their ``(correct, redo)``."""
    prompt_columns = [key for key in rollouts.keys() if key not in RESPONSE_SIDE_COLUMNS]

    def attempt(rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        prompts = rollouts[rows].select(*prompt_columns)
        again = replace(sampling, seed=restart_seed(runtime, batch_index, k))
        answers = ended_at_redo(runtime, runtime.rollout.generate_sequences(prompts, again), settings.redo_phrase)
        scored, _ = reward_scores(runtime, answers)
        return answer_flags(answers | scored, settings)

    return attempt


def restart_seed(runtime: Runtime, batch_index: int, restart: int) -> int:
    """A sampling seed per (validation batch, restart): restarts never reuse the first attempt's numbers."""
    key = [runtime.config.rollout.seed, runtime.step, batch_index, restart, 7]
    return int(np.random.SeedSequence(key).generate_state(1)[0] % 2**31)


def task_config(overrides: list[str], data_dir: Path) -> RunConfig:
    """config.yaml with ``overrides`` on the task written under ``data_dir``, or on the data files the
    overrides name. With ``recipe.instruction: true`` every training and validation file is replaced by
    its instructed copy (`re2_task.instructed_copy`, under ``data_dir``). A bad ``recipe.*`` key fails
    here, before anything starts."""

    def files(folder: Path) -> list[str]:
        return [f"data.train_files=[{folder / 'train.parquet'}]", f"data.val_files=[{folder / 'test.parquet'}]"]

    # 2-digit addition, bare style ("47+38=" -> "85"); README: why it needs restarts
    config = load_config(HERE / "config.yaml", [*files(ensure_task(data_dir)), *overrides])
    settings = recipe_settings(config, Re2Settings)
    if not settings.instruction:
        return config

    def instructed(key: str, paths: Sequence[str]) -> str:
        copies = [str(instructed_copy(Path(path), settings.redo_phrase, data_dir)) for path in paths]
        return f"data.{key}=[{','.join(copies)}]"

    data = config.data
    return load_config(
        HERE / "config.yaml",
        [*overrides, instructed("train_files", data.train_files), instructed("val_files", data.val_files)],
    )


def validation_with_restarts(runtime: Runtime, progress: Progress) -> dict[str, float]:
    """`fit`'s evaluation for Re²: the configured (greedy) validation and `redo_validation`'s sampled
    answers with test-time restarts."""
    settings = recipe_settings(runtime.config, Re2Settings)
    return {**validate(runtime), **redo_validation(runtime, settings, settings.val_samples)}


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = task_config(overrides, DATA)
    with start_ray(config), Runtime(config) as runtime:
        metrics = fit(runtime, re2_step, evaluate=validation_with_restarts)
    print({key: round(value, 4) for key, value in sorted(metrics.items())})
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
