"""Continuing from a prefix on the real vLLM engine (CPU build): a prefix moved into the prompt (the rows
recipes/re2 builds with ``continuation_prompts``) continues exactly as generating the whole sample did.

Greedy decoding makes it exact token for token (seeded sampling draws its random numbers per request, so a
continuation cannot replay the draws of the whole sample); sampled continuations are checked through their
log-probs, which must be those a training model computes with the prefix in the prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hybridflow.models import load_causal_lm
from hybridflow.parallel.launch import run_ranks
from hybridflow.rollout import (
    EngineDerived,
    SamplingParams,
    build_rollout_engine,
    response_log_probs,
)
from recipes.re2.re2_prefixes import continuation_prompts
from tests.rollout import _tiny

pytest.importorskip("vllm")

MAX_NEW = 16
GREEDY = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
RATIOS = (0.2, 0.5, 0.8)  # each row's prefix: this share of its greedy sample's tokens


def _continuation_checks(rank: int, world_size: int, model_dir: Path) -> dict[str, Any]:
    config = _tiny.vllm_config()
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=128))
    prompts = _tiny.prompts()
    pad = _tiny.tokenizer().pad_token_id
    whole = engine.generate(prompts, GREEDY)
    lengths = whole["response_lengths"].tolist()
    results: dict[str, Any] = {"lengths": lengths, "expected": [], "continued": [], "lp_gap": []}
    for ratio in RATIOS:
        cuts = [max(1, int(ratio * n)) for n in lengths]
        prefixes = [row[:k].tolist() for row, k in zip(whole["responses"], cuts, strict=True)]
        continued = engine.generate(
            continuation_prompts(prompts, prefixes, pad, prefix_width=MAX_NEW), GREEDY
        )
        for row, (k, n) in enumerate(zip(cuts, lengths, strict=True)):
            # A sample that stopped must stop at the same token; one cut by the length limit is compared
            # up to that limit (the continuation had more room).
            end = continued["response_lengths"][row] if whole["finish_reason"][row] == "stop" else n - k
            results["expected"].append(whole["responses"][row, k:n].tolist())
            results["continued"].append(continued["responses"][row, :end].tolist())
            gap = whole["rollout_log_probs"][row, k:n] - continued["rollout_log_probs"][row, : n - k]
            results["lp_gap"].append(float(gap.abs().max()))
    # Sampled continuations of one prefix per prompt: the engine's log-probs are the training model's,
    # with the prefix in the prompt and only the continuation as the response.
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=MAX_NEW, seed=3)
    prefixes = [row[: max(1, n // 2)].tolist() for row, n in zip(whole["responses"], lengths, strict=True)]
    sampled = engine.generate(continuation_prompts(prompts, prefixes, pad, prefix_width=MAX_NEW), sampling)
    recomputed = response_log_probs(load_causal_lm(model_dir), sampled, sampling)
    mask = sampled["response_mask"].bool()
    results["sampled_gap"] = float((sampled["rollout_log_probs"] - recomputed).abs()[mask].max())
    results["sampled_distinct"] = len({tuple(r) for r in sampled["responses"].tolist()})
    results["prompts_end_with_prefix"] = [
        sampled["input_ids"][i, -len(prefixes[i // 4]) :].tolist() == prefixes[i // 4]
        for i in range(len(sampled))
    ]
    return results


@pytest.mark.slow
def test_greedy_continuation_from_a_prefix_equals_the_whole_generation(tiny_model_dir: Path):
    (result,) = run_ranks(_continuation_checks, 1, tiny_model_dir, timeout_s=400)
    assert min(result["lengths"]) >= 2, result["lengths"]
    assert result["continued"] == result["expected"]
    # Same tokens after the same context: the same log-probs (fp32 engine).
    assert max(result["lp_gap"]) < 1e-4, result["lp_gap"]
    assert result["sampled_gap"] < 1e-2, result["sampled_gap"]
    assert all(result["prompts_end_with_prefix"])
    assert result["sampled_distinct"] > 4  # 16 sampled continuations, not one repeated
