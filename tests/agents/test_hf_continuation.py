"""The HF engine continues an episode from its kept KV cache: a turn prefills only the ids added since
the episode's last turn, and samples what prefilling the whole history samples."""

from __future__ import annotations

import torch

from hybridflow.rollout import HFRolloutEngine, SamplingParams
from tests.rollout import _tiny

GREEDY = SamplingParams(temperature=0, max_new_tokens=5)
OBSERVATION = [5, 6, 7]  # ids of "=0(" ... any inserted ids


def _turns(kept_cache_bytes: int) -> tuple[list[list[list[int]]], list[list[list[float]]], list[int]]:
    """Three greedy turns of four episodes; the ids, log-probs and ids the model was fed per turn."""
    tokenizer = _tiny.tokenizer()
    model = _tiny.model()
    fed: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda _m, args, _out: fed.append(args[0].numel()))
    engine = HFRolloutEngine(
        model, [tokenizer.eos_token_id], tokenizer.pad_token_id, kept_cache_bytes=kept_cache_bytes
    )
    prefixes = [tokenizer.encode(p, add_special_tokens=False) for p in _tiny.PROMPT_TEXTS]
    ids, log_probs, fed_per_turn = [], [], []
    for _ in range(3):
        fed.clear()
        samples = engine.continue_token_lists(prefixes, GREEDY)
        fed_per_turn.append(sum(fed))
        ids.append([list(s.token_ids) for s in samples])
        log_probs.append([list(s.log_probs) for s in samples])
        prefixes = [p + list(s.token_ids) + OBSERVATION for p, s in zip(prefixes, samples, strict=True)]
    return ids, log_probs, fed_per_turn


def test_kept_cache_feeds_only_new_ids_and_samples_the_same_turns():
    kept_ids, kept_log_probs, kept_fed = _turns(1 << 30)
    whole_ids, whole_log_probs, whole_fed = _turns(0)
    assert kept_ids == whole_ids
    for kept, whole in zip(kept_log_probs, whole_log_probs, strict=True):
        for a, b in zip(kept, whole, strict=True):
            assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)
    # Turn 1 onward: the kept run feeds each episode's last sampled id and the observation (1 + 3
    # ids, left-padded to the widest row) then one id per decoding step; the whole run re-feeds the
    # history. Each decoding step feeds one id per live row in both runs.
    assert kept_fed[0] == whole_fed[0]
    decode_fed = [sum(len(s) - 1 for s in turn) for turn in kept_ids]
    for turn in (1, 2):
        assert kept_fed[turn] == 4 * (1 + len(OBSERVATION)) + decode_fed[turn]
        assert whole_fed[turn] > kept_fed[turn] + 4 * 5 * turn
