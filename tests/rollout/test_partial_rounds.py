"""Partial rollouts on the real engines (HF, and vLLM's CPU build): greedy samples generated in rounds of 3
tokens, paused and continued, are token for token the samples of one uninterrupted greedy call; after a
weight update between rounds, the continued tokens are the new weights' greedy continuation of the prefix,
and each token carries the version of the weights that sampled it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridflow.models import load_causal_lm
from hybridflow.parallel.launch import run_ranks
from hybridflow.rollout import (
    EngineDerived,
    HFRolloutEngine,
    SamplingParams,
    build_rollout_engine,
)
from hybridflow.rollout.base import RolloutEngine
from hybridflow.rollout.partial import response_columns, run_round, start_samples
from tests.rollout import _tiny

CAP = 12
BUDGET = 3
GREEDY = SamplingParams(temperature=0, max_new_tokens=CAP)
V1, V2 = 4, 5  # policy versions of the two weight sets


def _rounds(engine: RolloutEngine, budget_then_update: bool, budget: int = BUDGET) -> dict[str, Any]:
    """Greedy samples of the tiny prompts in rounds of ``budget`` tokens, with the reference each must match.

    ``budget_then_update``: one round on the initial weights, then the perturbed weights, rounds to the end.
    Otherwise every round on the initial weights.
    """
    prompts = _tiny.prompts()
    pad = engine.pad_token_id
    whole = engine.generate(prompts, GREEDY)
    samples = start_samples(prompts, 1)
    reports = [run_round(engine.generate, samples, GREEDY, budget, V1, pad)]
    version = V1
    if budget_then_update:
        engine.update_weights(iter(_tiny.perturbed_state(_tiny.model(), scale=0.2).items()))
        version = V2
    while any(not s.finished for s in samples):
        reports.append(run_round(engine.generate, samples, GREEDY, budget, version, pad))
    result: dict[str, Any] = {
        "tokens": [s.token_ids for s in samples],
        "versions": [s.versions for s in samples],
        "reasons": [s.finish_reason for s in samples],
        "rounds": [s.rounds for s in samples],
        "resumed": [r.resumed for r in reports],
        "kept": [r.generated_tokens for r in reports],
        "whole_tokens": [
            row[:n].tolist() for row, n in zip(whole["responses"], whole["response_lengths"], strict=True)
        ],
        "whole_reasons": list(whole["finish_reason"]),
        "whole_log_probs": [
            row[:n].tolist()
            for row, n in zip(whole["rollout_log_probs"], whole["response_lengths"], strict=True)
        ],
        "log_probs": [s.log_probs for s in samples],
    }
    columns = response_columns(samples, CAP, pad)
    result["column_versions"] = columns["token_versions"].tolist()
    result["column_mask"] = columns["response_mask"].tolist()
    if budget_then_update:
        # The reference: the new weights' greedy continuation of each first-round prefix.
        prefixes = [
            p + t[:BUDGET]
            for p, t in zip([list(s.prompt_ids) for s in samples], result["tokens"], strict=True)
        ]
        room = [CAP - len(t[:BUDGET]) for t in result["tokens"]]
        continued = engine.continue_token_lists(
            prefixes, SamplingParams(temperature=0, max_new_tokens=max(room))
        )
        result["expected_tails"] = [list(c.token_ids[:r]) for c, r in zip(continued, room, strict=True)]
    return result


def _staggered(engine: RolloutEngine, budget: int = 5) -> dict[str, Any]:
    """Rounds of ``budget`` where a second copy of the prompts starts one round after the first: from the
    third round on, one round holds samples of different budgets (2 left to the cap next to 5)."""
    prompts = _tiny.prompts()
    whole = engine.generate(prompts, GREEDY)
    first, second = start_samples(prompts, 1), start_samples(prompts, 1)
    run_round(engine.generate, first, GREEDY, budget, V1, engine.pad_token_id)
    calls: list[int] = []

    def counted(batch, sampling):
        calls.append(sampling.max_new_tokens)
        return engine.generate(batch, sampling)

    while any(not s.finished for s in first + second):
        run_round(counted, first + second, GREEDY, budget, V1, engine.pad_token_id)
    expected = [
        row[:n].tolist() for row, n in zip(whole["responses"], whole["response_lengths"], strict=True)
    ]
    return {
        "first": [s.token_ids for s in first],
        "second": [s.token_ids for s in second],
        "expected": expected,
        "calls": calls,
    }


def _check_staggered(result: dict[str, Any]) -> None:
    assert result["first"] == result["expected"] and result["second"] == result["expected"]
    assert 2 in result["calls"] and 5 in result["calls"], result["calls"]


def _vllm_rounds(rank: int, world_size: int, model_dir: Path, budget_then_update: bool) -> dict[str, Any]:
    config = _tiny.vllm_config()
    # As tight as the trainer sizes it (prompt + cap): a round's call must fit each of its prefixes.
    longest = int(_tiny.prompts()["attention_mask"].sum(-1).max())
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=longest + CAP))
    return {
        "same": _rounds(engine, False),
        "updated": _rounds(engine, budget_then_update),
        "uneven": _rounds(engine, False, budget=5),
        "staggered": _staggered(engine),
    }


def _check_same_weights(result: dict[str, Any], budget: int = BUDGET) -> None:
    assert max(result["rounds"]) >= -(-CAP // budget), result  # some sample ran every round to the cap
    assert result["tokens"] == result["whole_tokens"]
    assert result["reasons"] == result["whole_reasons"]
    for got, want in zip(result["log_probs"], result["whole_log_probs"], strict=True):
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4
    assert result["versions"] == [[V1] * len(t) for t in result["tokens"]]
    # Round 1 starts every sample; each later round resumes exactly the samples it was given.
    assert result["resumed"][0] == 0 and all(r > 0 for r in result["resumed"][1:])
    assert sum(result["kept"]) == sum(len(t) for t in result["tokens"])


def _check_updated(result: dict[str, Any]) -> None:
    heads = [t[:BUDGET] for t in result["tokens"]]
    tails = [t[BUDGET:] for t in result["tokens"]]
    # The first round is the initial weights' greedy start; the rest, the new weights' continuation.
    assert heads == [t[:BUDGET] for t in result["whole_tokens"]]
    continued = [i for i, t in enumerate(result["tokens"]) if len(t) > BUDGET]
    assert continued, result
    for i in continued:
        assert tails[i] == result["expected_tails"][i][: len(tails[i])]
    assert any(tails[i] != result["whole_tokens"][i][BUDGET:] for i in continued)  # the update changed them
    for tokens, versions, mask_row, column in zip(
        result["tokens"], result["versions"], result["column_mask"], result["column_versions"], strict=True
    ):
        head = min(BUDGET, len(tokens))
        assert versions == [V1] * head + [V2] * (len(tokens) - head)
        assert column == versions + [0] * (CAP - len(tokens))
        assert mask_row == [1] * len(tokens) + [0] * (CAP - len(tokens))


def test_hf_rounds_equal_one_greedy_call_and_carry_versions(tiny_model_dir: Path) -> None:
    tokenizer = _tiny.tokenizer()
    for update in (False, True):
        engine = HFRolloutEngine(
            load_causal_lm(tiny_model_dir), (tokenizer.eos_token_id,), tokenizer.pad_token_id
        )
        result = _rounds(engine, update)
        (_check_updated if update else _check_same_weights)(result)
    # Rounds of 5 under a cap of 12: the last round gives 2 tokens to samples at 10 and 5 to others.
    _check_same_weights(_rounds(engine, False, budget=5), budget=5)
    _check_staggered(_staggered(engine))


@pytest.mark.slow
def test_vllm_rounds_equal_one_greedy_call_and_carry_versions(tiny_model_dir: Path) -> None:
    pytest.importorskip("vllm")
    (result,) = run_ranks(_vllm_rounds, 1, tiny_model_dir, True, timeout_s=400)
    _check_same_weights(result["same"])
    _check_updated(result["updated"])
    _check_same_weights(result["uneven"], budget=5)
    # Each call fits the engine's max_model_len (prompt + cap) although the round mixes budgets.
    _check_staggered(result["staggered"])
