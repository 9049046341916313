"""The task's signal before any training: SmolLM2-135M-Instruct on the 50 held-out problems (products,
or ``--task word_problems``), with and without the calculator, greedy and sampled.

For each prompt set (the calculator's, and the baseline's: no tool, no demonstration, calls never run)
it runs one greedy episode per problem and ``--samples`` episodes per problem at the training
temperature (``rollout.temperature``; a GRPO group), with the recipe's environment, codec and limits,
on the HF engine in this process, and prints accuracy, tool-call rate, accuracy among the episodes that
called, and the share of groups holding both a right and a wrong answer (only those carry a GRPO
advantage).

Run:  python -m recipes.smollm2_tools.probe [--samples 8] [--task products|word_problems]
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.agents import AgentConfig, ChatCodec, episodes_to_batch, make_environment, run_episodes
from hybridflow.data import read_rows
from hybridflow.models.gguf import SMOLLM2_PACKAGE, ensure_converted, find_package_gguf
from hybridflow.rollout import HFRolloutEngine, SamplingParams
from recipes.smollm2_tools.evaluation import summarise
from recipes.smollm2_tools.main import CACHE, MODEL_DIR, recipe_config
from recipes.smollm2_tools.task import TASKS, ensure_task_files


def chat_rows(rows: list[dict], samples: int) -> list[dict]:
    """The ``tool_calls`` environment's rows (``prompt`` messages, ``ground_truth``, ``data_source``) of
    the task's data ``rows``, each repeated ``samples`` times in a row (a group)."""
    return [
        {
            "prompt": row["prompt"],
            "ground_truth": row["reward_model"]["ground_truth"],
            "data_source": row["data_source"],
        }
        for row in rows
        for _ in range(samples)
    ]


def probe(
    engine: HFRolloutEngine,
    tokenizer: AutoTokenizer,
    rows: list[dict],
    tools: list[str],
    samples: int,
    temperature: float,
    max_new_tokens: int,
    agent: AgentConfig,
) -> dict[str, float]:
    """`summarise` of ``samples`` episodes per row (``tools``: the calculator, or none), plus
    ``mixed_groups``: the share of rows whose episodes scored both 0 and 1."""
    environment = functools.partial(
        make_environment, agent.environment, **{**agent.environment_kwargs, "tools": tools}
    )
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    rollout = run_episodes(
        engine, chat_rows(rows, samples), environment, ChatCodec(tokenizer), sampling, agent
    )
    batch = episodes_to_batch(rollout, tokenizer.pad_token_id)
    groups = (batch["scores"] >= 1.0).view(len(rows), samples).float().mean(dim=1)
    mixed = ((groups > 0) & (groups < 1)).float().mean().item()
    return {**summarise(batch["scores"], batch["num_turns"]), "mixed_groups": mixed}


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.smollm2_tools.probe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--samples", type=int, default=8, help="sampled episodes per problem (default 8)")
    parser.add_argument("--task", choices=TASKS, default="products", help="the problems (default products)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    ensure_converted(find_package_gguf(SMOLLM2_PACKAGE), MODEL_DIR)
    files = ensure_task_files(CACHE / "data", task=args.task)
    config = recipe_config(files, [], args.task)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    engine = HFRolloutEngine(model, [tokenizer.eos_token_id], tokenizer.pad_token_id, seed=0)
    print(
        f"{'prompt':<11} {'sampling':<10} {'accuracy':>9} {'tool calls':>10} {'right|call':>10} {'mixed groups':>12}"
    )
    for name, tools in (("calculator", ["calculator"]), ("baseline", [])):
        rows = read_rows(files["test" if tools else "baseline_test"])
        sampled = (
            f"T={config.rollout.temperature} x{args.samples}",
            args.samples,
            config.rollout.temperature,
        )
        for label, samples, temperature in (("greedy", 1, 0.0), sampled):
            result = probe(
                engine,
                tokenizer,
                rows,
                tools,
                samples,
                temperature,
                config.data.max_response_length,
                config.agent,
            )
            mixed = f"{result['mixed_groups']:.0%}" if samples > 1 else "-"
            print(
                f"{name:<11} {label:<10} {result['eval/accuracy']:>9.1%} {result['eval/tool_call_rate']:>10.1%} "
                f"{result['eval/call_accuracy']:>10.1%} {mixed:>12}"
            )


if __name__ == "__main__":
    main(sys.argv[1:])
