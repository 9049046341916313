"""Command line: ``python -m trainer.main --config grpo.yaml key=value ...`` (or ``hybridflow ...``).

Loads and validates the config (every problem reported at once, by key), starts or joins a Ray
cluster, and runs `RLTrainer.fit`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from trainer.config import ConfigError, load_config
from trainer.ray_runtime import start_ray
from trainer.rl_trainer import RLTrainer

__all__ = ["cli", "main"]


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="hybridflow", description="Run a PPO/GRPO config.")
    parser.add_argument("--config", help="a YAML file (e.g. trainer/config/grpo.yaml); defaults apply without it")
    parser.add_argument("--ray-address", help="join this Ray cluster instead of starting a local one")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides, applied after the file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = load_config(args.config, args.overrides)
    with start_ray(config, args.ray_address), RLTrainer(config) as trainer:
        return trainer.fit()


def cli() -> None:
    """Entry point of the installed ``hybridflow`` command."""
    try:
        main()
    except ConfigError as error:
        print(error, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    cli()
