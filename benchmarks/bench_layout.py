"""The demo's GRPO step on two ranks of one thread against one rank of two threads.

On a tiny model FSDP2's collectives and a second process can cost more than they save. The one-rank
layout is a config, not a code path: ``resource.slots_per_node=1 resource.cpus_per_slot=2`` gives one
colocated worker process (vLLM engine and FSDP2 actor over a world of one) whose torch runs two
threads. Both layouts run the demo's config (recipes/arithmetic_demo) from its cached warm start for
``--steps`` steps, one after the other, ``--rounds`` times alternating, so that load from other processes
hits both alike. Each run reports the median over its steps (the first two left out: compile and cache
warm-up) of the step and of its phases, from the trainer's own metrics.

    RAY_AUTH_MODE=disabled python benchmarks/bench_layout.py [--steps 25] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path

from hybridflow.metrics import read_jsonl
from recipes.arithmetic_demo import main as DEMO
from trainer.algorithms import rl_step
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.runtime import Runtime
from trainer.warm_start import warm_started_model

REPO = Path(__file__).resolve().parents[1]

LAYOUTS = {
    "2 ranks x 1 thread": ["resource.slots_per_node=2", "resource.cpus_per_slot=1"],
    "1 rank x 2 threads": ["resource.slots_per_node=1", "resource.cpus_per_slot=2"],
}
PHASES = {
    "step": "timing_s/step",
    "generation": "timing_s/generation",
    "update": "timing_s/update",
    "weight push": "resharding/to_inference_s",
    "back to training": "resharding/to_training_s",
}
WARM_UP_STEPS = 2


def run_layout(name: str, overrides: list[str], model_dir: Path, data_dir: Path, steps: int, tag: str) -> dict:
    """Median seconds of each phase over the layout's steps after the warm-up."""
    output = REPO / "outputs" / "bench_layout" / f"{tag}-{name.split()[0]}"
    config = DEMO.demo_config(
        data_dir,
        0,
        [
            *overrides,
            f"trainer.total_steps={steps}",
            "trainer.val_before_train=false",
            "trainer.val_every=0",
            "trainer.loggers=[jsonl]",
            f"trainer.output_dir={output}",
            "trainer.resume=disable",
            "trainer.existing_output=delete",
        ],
        model_dir,
    )
    with start_ray(config), Runtime(config) as runtime:
        fit(runtime, rl_step)
    records = [r for r in read_jsonl(output / "metrics.jsonl") if "timing_s/step" in r][WARM_UP_STEPS:]
    return {phase: statistics.median(r[key] for r in records) for phase, key in PHASES.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    data_dir = DEMO.ensure_arithmetic_splits(DEMO.CACHE / "data")
    model_dir, _ = warm_started_model(
        DEMO.demo_config(data_dir, 0, []), DEMO.CACHE, replace(DEMO.WARM_START, seed=0)
    )
    results: dict[str, list[dict]] = {name: [] for name in LAYOUTS}
    for round_index in range(args.rounds):
        for name, overrides in LAYOUTS.items():
            results[name].append(run_layout(name, overrides, model_dir, data_dir, args.steps, f"r{round_index}"))
    print(f"\nmedian seconds per step (steps {WARM_UP_STEPS + 1}-{args.steps}), round by round")
    print(f"{'phase':>18} " + " ".join(f"{name:>20}" for name in LAYOUTS) + "  ratio (2 ranks / 1 rank)")
    baseline, one_rank = LAYOUTS
    for round_index in range(args.rounds):
        for phase in PHASES:
            cells = [results[name][round_index][phase] for name in LAYOUTS]
            ratio = results[baseline][round_index][phase] / results[one_rank][round_index][phase]
            print(f"{f'r{round_index} {phase}':>18} " + " ".join(f"{c:>20.3f}" for c in cells) + f"  {ratio:.2f}x")


if __name__ == "__main__":
    main()
