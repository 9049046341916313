"""The tool recipe: its data never shows a product before GRPO, its environment scores and counts calls
as stated, and two GRPO steps with episodes run under `fit` with the recipe's held-out evaluation.

The run uses real Ray, FSDP2 and the HF engine on one rank, and a tiny character model trained here to
answer ``123*45=`` through the calculator, so the evaluation's accuracy and tool-call rate are known."""

from __future__ import annotations

import re

import pytest
import torch

from hybridflow.agents import ModelTurn, get_environment
from hybridflow.data import read_rows, write_rows
from hybridflow.data.char_tokenizer import build_char_tokenizer
from hybridflow.metrics import read_jsonl
from hybridflow.models import build_tiny_causal_lm, save_model_dir
from hybridflow.tools import ToolOutcome
from hybridflow.tools.calculator import evaluate
from recipes.tool_arithmetic import main as recipe
from recipes.tool_arithmetic.environment import CalculatorArithmetic
from recipes.tool_arithmetic.evaluation import EVAL_METRICS, episode_evaluation, summarise
from recipes.tool_arithmetic.task import TASK_SHAPE, call_script, ensure_task_files, format_rows
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.runtime import Runtime

TOKENIZER = build_char_tokenizer()
PROMPT, PRODUCT = "123*45=", "5535"


def _turn(text: str, turn: int = 0) -> ModelTurn:
    return ModelTurn(tuple(TOKENIZER.encode(text, add_special_tokens=False)), text, "stop", turn)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return ensure_task_files(tmp_path_factory.mktemp("tool_arithmetic"), num_train=60, num_test=20)


def test_the_format_data_never_shows_the_task_and_every_call_copies_its_question(files):
    format_rows_ = [row for key in ("format_train", "format_test") for row in read_rows(files[key])]
    pairs = [(row["prompt"][0]["content"], row["reward_model"]["ground_truth"]) for row in format_rows_]
    assert not any(TASK_SHAPE.search(prompt + target) for prompt, target in pairs)
    for prompt, target in pairs:
        expression = prompt.removesuffix("=")
        if target.startswith("<calc>"):  # the call holds the question's expression verbatim
            assert target.startswith(f"<calc>{expression}</calc>")
        else:  # answered directly: one-digit sums and products only
            assert re.fullmatch(r"\d[+*]\d", expression) and target == str(evaluate(expression))
    # A lone * is copied into calls, but only inside three-operand expressions.
    lone_star = [p for p, t in pairs if t.startswith("<calc>") and re.search(r"\d\*\d", p)]
    assert lone_star and all(len(re.findall(r"\d+", p)) == 3 for p in lone_star)
    assert TASK_SHAPE.search("7+123*45") and not TASK_SHAPE.search("1234*45") and not TASK_SHAPE.search("123**45")
    train = {row["prompt"][0]["content"] for row in read_rows(files["train"])}
    test = read_rows(files["test"])
    assert len(test) == 20 and not train & {row["prompt"][0]["content"] for row in test}
    for row in test:
        a, b = map(int, re.fullmatch(r"(\d{3})\*(\d{2})=", row["prompt"][0]["content"]).groups())
        assert row["reward_model"]["ground_truth"] == str(a * b)
    # The held-out format rows hold the first turn only; a training row's script, the whole episode.
    assert call_script("21*89-1", 1868) == (
        "<calc>21*89-1</calc>",
        "<calc>21*89-1</calc></s><r>1868</r>1868",
    )
    rows = format_rows(300, 30, seed=3)
    assert all("</s>" not in row["reward_model"]["ground_truth"] for row in rows["test"])
    held_out = {row["prompt"][0]["content"] for row in rows["test"] if row["reward_model"]["ground_truth"][0] == "<"}
    assert held_out and not held_out & {row["prompt"][0]["content"] for row in rows["train"]}


def test_config_loads_and_its_recipe_section_is_the_warm_start(files, tmp_path):
    config = recipe.recipe_config(files, 2, ["recipe.warm_start_steps=7"], tmp_path)
    assert config.agent.environment == "calculator_arithmetic"
    assert dict(config.agent.environment_kwargs) == {"calculator": True}
    assert (config.model.path, config.data.val_files) == (str(tmp_path), (str(files["test"]),))
    assert (config.model.tiny.seed, config.rollout.seed, config.data.seed) == (2, 2, 2)
    warm = recipe.recipe_config(files, 2, [], warm=True)
    assert warm.data.train_files == (str(files["format_train"]),)
    start = recipe.warm_start_config(config, 2)
    assert (start.steps, start.max_steps, start.batch_size, start.seed) == (7, 7, 32, 2)
    baseline = recipe.recipe_config(files, 0, ["agent.environment_kwargs.calculator=false"])
    assert dict(baseline.agent.environment_kwargs) == {"calculator": False}


def test_the_environment_runs_a_call_then_scores_the_exact_answer():
    env = get_environment("calculator_arithmetic")()
    assert isinstance(env, CalculatorArithmetic)
    assert env.start({"prompt": PROMPT, "ground_truth": PRODUCT}) == PROMPT
    called = env.step(_turn("<calc>123*45</calc>"))
    assert (called.observation, called.done, called.reward) == ("<r>5535</r>", False, None)
    assert [r.outcome for r in called.tool_results] == [ToolOutcome.OK]
    assert env.step(_turn(" 5535\n", 1)).reward == 1.0
    assert env.step(_turn("The answer is 5535", 1)).reward == 0.0  # exact, no number extraction
    bad = env.step(_turn("<calc>123x45</calc>"))
    assert bad.observation.startswith("<r>error:") and bad.tool_results[0].outcome == ToolOutcome.ERROR


def test_without_the_calculator_a_call_is_a_wrong_answer():
    env = get_environment("calculator_arithmetic")(calculator=False)
    env.start({"prompt": PROMPT, "ground_truth": PRODUCT})
    result = env.step(_turn("<calc>123*45</calc>"))
    assert (result.done, result.reward, result.tool_results, result.observation) == (True, 0.0, (), None)
    assert env.step(_turn(PRODUCT)).reward == 1.0


def test_summarise_counts_written_calls_and_their_accuracy():
    texts = [
        "<calc>123*45</calc><r>5535</r>5535",  # called, right
        "<calc>123*45</calc>",  # called (baseline: no result), wrong
        "<calc>123*45",  # an unclosed tag is no call
        "5535",  # right without the tool
    ]
    metrics = summarise(torch.tensor([1.0, 0.0, 0.0, 1.0]), texts, torch.tensor([2, 1, 1, 1]))
    assert metrics == {
        "eval/accuracy": 0.5,
        "eval/tool_call_rate": 0.5,
        "eval/call_accuracy": 0.5,
        "eval/turns_mean": 1.25,
    }


def _scripted_model(root) -> str:
    """A tiny character model that writes the call after ``PROMPT`` and the product after its result."""
    eos = TOKENIZER.eos_token_id

    def encode(text: str) -> list[int]:
        return TOKENIZER.encode(text, add_special_tokens=False)

    head = encode(PROMPT) + encode("<calc>123*45</calc>") + [eos]
    observation = encode("<r>5535</r>")
    ids = torch.tensor([head + observation + encode(PRODUCT) + [eos]])
    labels = ids.clone()
    labels[0, : len(encode(PROMPT))] = -100
    labels[0, len(head) : len(head) + len(observation)] = -100
    model = build_tiny_causal_lm(len(TOKENIZER), max_position_embeddings=128, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.01, f"the tiny model did not learn its script (loss {loss.item():.3f})"
    return str(save_model_dir(model, TOKENIZER, root / "model"))


def test_two_grpo_steps_with_episodes_and_the_held_out_evaluation(ray_cluster, tmp_path):
    row = {
        "data_source": "tool_arithmetic",
        "prompt": [{"role": "user", "content": PROMPT}],
        "reward_model": {"ground_truth": PRODUCT},
    }
    write_rows([{**row, "extra_info": {"index": i}} for i in range(8)], tmp_path / "train.parquet")
    write_rows([{**row, "extra_info": {"index": i}} for i in range(2)], tmp_path / "test.parquet")
    files = {"train": tmp_path / "train.parquet", "test": tmp_path / "test.parquet"}
    config = recipe.recipe_config(
        files,
        0,
        [
            "data.train_batch_size=4",
            "data.val_batch_size=2",
            "rollout.n=4",
            "actor.ppo_mini_batch_size=16",
            "actor.ppo_micro_batch_size=16",
            "actor.forward_micro_batch_size=16",
            "trainer.total_steps=2",
            "trainer.val_every=2",
            "trainer.loggers=[jsonl]",
            f"trainer.output_dir={tmp_path / 'run'}",
            "resource.cpus_per_slot=0.5",
        ],
        _scripted_model(tmp_path),
    )
    with Runtime(config) as runtime:
        last = fit(runtime, rl_step, evaluate=episode_evaluation(0.0))
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [record["step"] for record in records] == [0, 1, 2]
    before = records[0]
    # Greedy, the scripted model calls the tool on both held-out prompts and copies the result.
    assert {key: before[key] for key in EVAL_METRICS} == {
        "eval/accuracy": 1.0,
        "eval/tool_call_rate": 1.0,
        "eval/call_accuracy": 1.0,
        "eval/turns_mean": 2.0,
    }
    assert last == {key: records[2][key] for key in last}
    for record in records[1:]:
        assert record["agent/tool_calls"] >= 1  # sampled at temperature 1, most episodes still call
        assert record["agent/turns_mean"] > 1.0
