"""The transformers engine against hand-rolled decoding over the model's own logits."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.models import load_causal_lm
from hybridflow.protocol import Batch
from hybridflow.rollout import (
    HFRolloutEngine,
    RolloutConfig,
    SamplingParams,
    build_rollout_engine,
    response_log_probs,
)
from tests.rollout import _tiny

EOS = 2


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFRolloutEngine:
    built = build_rollout_engine(RolloutConfig(engine="hf", hf_max_batch_rows=5), tiny_model_dir)
    assert isinstance(built, HFRolloutEngine)
    return built


def _greedy_by_hand(
    model: torch.nn.Module, prompt: list[int], max_new_tokens: int, stop_ids: set[int]
) -> tuple[list[int], list[float]]:
    """Unpadded greedy decoding, one full forward per step: tokens and their log_softmax(logits)."""
    tokens: list[int] = []
    log_probs: list[float] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([prompt + tokens])).logits[0, -1].float()
            token = int(logits.argmax())
            tokens.append(token)
            log_probs.append(float(logits.log_softmax(-1)[token]))
            if token in stop_ids:
                break
    return tokens, log_probs


def _token_lists(batch: Batch) -> list[list[int]]:
    return [
        row[:length].tolist()
        for row, length in zip(batch["responses"], batch["response_lengths"], strict=True)
    ]


def test_greedy_equals_hand_rolled_loop_with_its_log_probs(engine: HFRolloutEngine) -> None:
    prompts = _tiny.prompts()
    out = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=10))
    for row, prompt in enumerate(_tiny.prompts()["input_ids"]):
        real = prompt[prompts["attention_mask"][row].bool()].tolist()
        tokens, log_probs = _greedy_by_hand(engine.model, real, 10, {EOS})
        length = int(out["response_lengths"][row])
        assert out["responses"][row, :length].tolist() == tokens
        torch.testing.assert_close(
            out["rollout_log_probs"][row, :length], torch.tensor(log_probs), atol=1e-5, rtol=0
        )
        assert out["finish_reason"][row] == ("stop" if tokens[-1] == EOS else "length")
    # Past each response's end: pad ids, zero mask, zero log-probs.
    beyond = out["response_mask"] == 0
    assert (out["responses"][beyond] == engine.pad_token_id).all()
    assert (out["rollout_log_probs"][beyond] == 0).all()
    assert out["response_mask"].sum(1).tolist() == out["response_lengths"].tolist()


def test_every_sample_of_a_shared_prompt_prefill_decodes_like_its_own_prompt(tiny_model_dir: Path) -> None:
    # Each prompt is prefilled once and its cache copied to its n samples; samples that stop leave the
    # batch. Greedy samples of one prompt must all equal the unpadded hand-rolled loop over that prompt:
    # a cache copied to the wrong rows, or rows mixed up after one leaves, would give another prompt's
    # continuation. Two prompts per call (7 // 3) also joins calls.
    engine = build_rollout_engine(RolloutConfig(engine="hf", hf_max_batch_rows=7), tiny_model_dir)
    prompts = _tiny.prompts()
    real_prompts = [
        prompt[mask.bool()].tolist()
        for prompt, mask in zip(prompts["input_ids"], prompts["attention_mask"], strict=True)
    ]
    # A stop token early in the first prompt's continuation, so that samples end at different steps.
    stop = _greedy_by_hand(engine.model, real_prompts[0], 10, {EOS})[0][2]
    out = engine.generate(
        prompts, SamplingParams(n=3, temperature=0, max_new_tokens=10, stop_token_ids=(stop,))
    )
    lengths = set()
    for row, real in enumerate(real_prompts):
        tokens, log_probs = _greedy_by_hand(engine.model, real, 10, {EOS, stop})
        lengths.add(len(tokens))
        for sample in range(row * 3, row * 3 + 3):
            assert _token_lists(out)[sample] == tokens
            torch.testing.assert_close(
                out["rollout_log_probs"][sample, : len(tokens)], torch.tensor(log_probs), atol=1e-5, rtol=0
            )
    assert len(lengths) > 1, "the samples should stop at different steps, so that rows leave the batch"


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(n=3, temperature=0.8, max_new_tokens=12, seed=1),
        SamplingParams(n=3, temperature=0.7, top_k=6, top_p=0.9, max_new_tokens=12, seed=2),
    ],
    ids=["temperature", "top_k_top_p"],
)
def test_samples_are_interleaved_and_log_probs_match_the_sampling_distribution(
    engine: HFRolloutEngine, sampling: SamplingParams
) -> None:
    prompts = _tiny.prompts()
    out = engine.generate(prompts, sampling)
    n = sampling.n
    assert len(out) == len(prompts) * n
    assert out["uid"].tolist() == [uid for uid in prompts["uid"] for _ in range(n)]
    torch.testing.assert_close(out["input_ids"], prompts["input_ids"].repeat_interleave(n, 0))
    # Each row's log-probs recomputed with its own prompt as context: a sample attached to the wrong
    # prompt, or log-probs of the wrong distribution (no temperature, no filter), would not match.
    recomputed = response_log_probs(engine.model, out, sampling)
    torch.testing.assert_close(recomputed, out["rollout_log_probs"], atol=1e-5, rtol=0)
    unfiltered = response_log_probs(engine.model, out, SamplingParams(temperature=1.0))
    assert (unfiltered - out["rollout_log_probs"]).abs().max() > 0.05
    groups = _token_lists(out)
    assert any(len({tuple(s) for s in groups[i * n : (i + 1) * n]}) > 1 for i in range(len(prompts)))


def test_stop_token_ends_the_response_at_its_first_occurrence(engine: HFRolloutEngine) -> None:
    prompts = _tiny.prompts()
    free = _token_lists(engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=10)))
    row, position = next(
        (r, i) for r, tokens in enumerate(free) for i, t in enumerate(tokens) if i >= 2 and t != EOS
    )
    stop = free[row][position]
    out = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=10, stop_token_ids=(stop,)))
    stopped = _token_lists(out)[row]
    assert stopped == free[row][: free[row].index(stop) + 1]
    assert out["finish_reason"][row] == "stop"
    for tokens, reason in zip(_token_lists(out), out["finish_reason"], strict=True):
        assert (reason == "stop") == (tokens[-1] in (stop, EOS))
        assert reason == "stop" or len(tokens) == 10


def test_seeds_reproduce_and_fresh_calls_differ(engine: HFRolloutEngine) -> None:
    prompts = _tiny.prompts()
    seeded = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, seed=7)
    assert engine.generate(prompts, seeded).equals(engine.generate(prompts, seeded))
    fresh = SamplingParams(n=2, temperature=1.0, max_new_tokens=12)
    first, second = engine.generate(prompts, fresh), engine.generate(prompts, fresh)
    assert not torch.equal(first["responses"], second["responses"])


def test_update_weights_switches_generation_to_the_new_weights(tiny_model_dir: Path) -> None:
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), eos_token_ids=(EOS,), pad_token_id=0)
    greedy = SamplingParams(temperature=0, max_new_tokens=10)
    before = engine.generate(_tiny.prompts(), greedy)
    new_state = _tiny.perturbed_state(_tiny.model(), scale=0.2)
    engine.update_weights(iter(new_state.items()))
    after = engine.generate(_tiny.prompts(), greedy)
    reference = _tiny.model()
    reference.load_state_dict(new_state)
    torch.testing.assert_close(
        response_log_probs(reference, after, greedy), after["rollout_log_probs"], atol=1e-5, rtol=0
    )
    assert not torch.equal(before["responses"], after["responses"])
    with pytest.raises(KeyError, match="no parameter"):
        engine.update_weights([("model.not_a_layer.weight", torch.zeros(1))])


def test_right_padded_prompts_are_refused(engine: HFRolloutEngine) -> None:
    prompts = _tiny.prompts()
    flipped = Batch(
        {"input_ids": prompts["input_ids"].flip(1), "attention_mask": prompts["attention_mask"].flip(1)}
    )
    with pytest.raises(ValueError, match="left-padded"):
        engine.generate(flipped, SamplingParams(max_new_tokens=4))
