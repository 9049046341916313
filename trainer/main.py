"""Command line: ``python -m trainer.main --config grpo.yaml key=value ...`` (or ``hybridflow ...``).

Loads and validates the config (every problem reported at once, by key), checks that some prompt fits
``data.max_prompt_length`` (the one check that needs the tokenizer), settles the output folder and the
checkpoint to resume from (`trainer.run_folder.open_run`), starts or joins a Ray
cluster, builds the `Runtime` and runs the configured algorithm's step (`trainer.algorithms.rl_step`) under
`trainer.fit.fit`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from hybridflow.checkpoint import DiskFullError, IncompleteCheckpointError
from hybridflow.rewards import RewardFunctionFailingError
from trainer.algorithms import rl_step
from trainer.config import ConfigError, load_config
from trainer.config.prompt_lengths import check_prompts_fit, prompt_tokenizer
from trainer.fit import fit
from trainer.ray_runtime import start_ray
from trainer.run_folder import open_run
from trainer.runtime import Runtime

__all__ = ["cli", "main", "run_config_file"]


def run_config_file(
    path: str | Path | None, overrides: Sequence[str] = (), ray_address: str | None = None
) -> dict[str, float]:
    """Load and validate a config, start (or join) Ray, and train; returns the last validation metrics."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(path, overrides)
    check_prompts_fit(config, prompt_tokenizer(config))
    run = open_run(config)
    with (
        start_ray(config, ray_address) as ray_start,
        Runtime(config, startup_s={"ray": ray_start.seconds}, run=run) as runtime,
    ):
        return fit(runtime, rl_step)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="hybridflow", description="Run a PPO/GRPO config.")
    parser.add_argument("--config", help="a YAML file (e.g. trainer/config/grpo.yaml); defaults apply without it")
    parser.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after the file")
    args = parser.parse_args(argv)
    return run_config_file(args.config, args.overrides, args.ray_address)


def cli() -> None:
    """Entry point of the installed ``hybridflow`` command.

    Exits with code 2 on a config error (every problem printed, one per line, before any process
    starts; also an output folder holding another run under ``trainer.existing_output=refuse``, or a
    ``trainer.resume`` folder that is not a complete checkpoint), and with code 1 and a one-line message on the run's named failures: a full disk while
    checkpointing, a checkpoint to resume from that is incomplete, a reward function failing on every
    row. Anything else raises with its traceback.
    """
    if sys.argv[1:2] == ["plan"]:
        from trainer.plan import main as plan_main

        sys.exit(plan_main(sys.argv[2:]))
    try:
        main()
    except ConfigError as error:
        print(error, file=sys.stderr)
        sys.exit(2)
    except (DiskFullError, IncompleteCheckpointError, RewardFunctionFailingError) as error:
        print(f"hybridflow: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
