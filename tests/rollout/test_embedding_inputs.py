"""Decoding from input embeddings (``engine.embedding_session``): a one-hot mixture of token embeddings
gives the next-token distribution of the token ids themselves, at the first position and after appended
positions, on the HF engine (KV cache) and on vLLM (``prompt_embeds``, CPU build)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hybridflow.models import load_causal_lm
from hybridflow.parallel.launch import run_ranks
from hybridflow.rollout import EngineDerived, HFRolloutEngine, RolloutConfig, build_rollout_engine
from tests.rollout import _tiny

# Each row: a prompt, then tokens appended one position at a time.
PROMPTS = ("12+7=", "3*(4-1)=", "a")
APPENDED = ("45", "9=1", "bc")


def _ids(text: str) -> list[int]:
    return _tiny.tokenizer()(text)["input_ids"]


def _one_hot_mixture(ids: list[int], embedding: torch.Tensor) -> torch.Tensor:
    """``w^T E`` with ``w`` one-hot at each id: ``[len(ids), hidden]``."""
    weights = torch.nn.functional.one_hot(torch.tensor(ids), embedding.shape[0]).to(embedding.dtype)
    return weights @ embedding


def _token_id_log_probs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)


def _session_log_probs(engine: Any, embedding: torch.Tensor) -> list[torch.Tensor]:
    """``[rows, vocab]`` log-probs after the prompts and after each appended position (the third row
    appends fewer tokens; it is fed its last token again, and only the other rows are compared there)."""
    session = engine.embedding_session([_one_hot_mixture(_ids(p), embedding) for p in PROMPTS])
    steps = [session.log_probs.clone()]
    for t in range(max(len(a) for a in APPENDED)):
        ids = [_ids(a)[min(t, len(a) - 1)] for a in APPENDED]
        steps.append(session.append(_one_hot_mixture(ids, embedding)).clone())
    return steps


def _expected(row: int, step: int) -> list[int]:
    return _ids(PROMPTS[row]) + _ids(APPENDED[row])[:step]


def test_hf_engine_one_hot_embeddings_give_the_token_ids_distribution():
    model = _tiny.model()
    engine = HFRolloutEngine(model, eos_token_ids=(2,), pad_token_id=0)
    embedding = model.get_input_embeddings().weight.detach()
    steps = _session_log_probs(engine, embedding)
    for step, log_probs in enumerate(steps):
        for row in range(len(PROMPTS)):
            if step > len(APPENDED[row]):
                continue
            reference = _token_id_log_probs(model, _expected(row, step))
            torch.testing.assert_close(log_probs[row], reference, atol=1e-5, rtol=0)
    # A mixture is not a token: the distribution moves.
    mixed = engine.embedding_session([0.5 * (embedding[_ids("1")] + embedding[_ids("2")])]).log_probs[0]
    assert (mixed - _token_id_log_probs(model, _ids("1"))).abs().max() > 0.1


def _vllm_checks(rank: int, world_size: int, model_dir: Path) -> dict[str, Any]:
    from vllm import SamplingParams as VLLMSamplingParams

    config = RolloutConfig(
        engine="vllm",
        kv_cache_bytes=32 << 20,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        enforce_eager=True,
        enable_prompt_embeds=True,
        cache_dir=str(_tiny.CACHE_DIR),
    )
    engine = build_rollout_engine(config, model_dir, EngineDerived(max_model_len=64))
    model = load_causal_lm(model_dir)
    embedding = model.get_input_embeddings().weight.detach()
    steps = _session_log_probs(engine, embedding)
    token_params = VLLMSamplingParams(
        temperature=0.0, max_tokens=1, logprobs=-1, flat_logprobs=True, detokenize=False
    )
    gaps_to_vllm_ids, gaps_to_hf = [], []
    for step, log_probs in enumerate(steps):
        for row in range(len(PROMPTS)):
            if step > len(APPENDED[row]):
                continue
            ids = _expected(row, step)
            flat = engine.llm.generate([{"prompt_token_ids": ids}], token_params, use_tqdm=False)[0].outputs[0].logprobs
            from_ids = torch.full_like(log_probs[row], float("-inf"))
            span = slice(flat.start_indices[0], flat.end_indices[0])
            from_ids[torch.tensor(flat.token_ids[span])] = torch.tensor(flat.logprobs[span])
            gaps_to_vllm_ids.append((log_probs[row] - from_ids).abs().max().item())
            gaps_to_hf.append((log_probs[row] - _token_id_log_probs(model, ids)).abs().max().item())
    mixed = engine.embedding_session([0.5 * (embedding[_ids("1")] + embedding[_ids("2")])]).log_probs[0]
    return {
        "vocab": steps[0].shape[1],
        "gaps_to_vllm_ids": gaps_to_vllm_ids,
        "gaps_to_hf": gaps_to_hf,
        "mixture_moves": (mixed - _token_id_log_probs(model, _ids("1"))).abs().max().item(),
    }


@pytest.mark.slow
def test_vllm_one_hot_prompt_embeds_give_the_token_ids_distribution(tiny_model_dir: Path):
    pytest.importorskip("vllm")
    (result,) = run_ranks(_vllm_checks, 1, tiny_model_dir, timeout_s=400)
    assert result["vocab"] == len(_tiny.tokenizer())
    # After the prompt and after each appended token: 2 + 1, 3 + 1 and 2 + 1 positions.
    assert len(result["gaps_to_vllm_ids"]) == 3 + 4 + 3
    assert max(result["gaps_to_vllm_ids"]) < 1e-4, result
    assert max(result["gaps_to_hf"]) < 1e-4, result
    assert result["mixture_moves"] > 0.1
