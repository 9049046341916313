"""Dr. GRPO: GRPO without the std division and without the per-response length normalisation.

A config-only recipe: everything that makes the algorithm is in config.yaml (see README.md), and this
script only writes the data and runs `RLTrainer.fit`. With the data in place the same config runs from
the command line: `python -m trainer.main --config recipes/dr_grpo/config.yaml`.

Run:  python recipes/dr_grpo/main.py [key=value overrides of config.yaml]
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from hybridflow.data.synthetic import arithmetic_rows, write_splits
from trainer.config import load_config
from trainer.ray_runtime import start_ray
from trainer.rl_trainer import RLTrainer

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/dr_grpo/data")  # config.yaml's data.train_files / val_files point here


def prepare_data() -> None:
    """2-digit addition, bare style ("47+38=" -> "85"); the split of recipes/arithmetic_demo."""
    if not (DATA / "test.parquet").exists():
        write_splits(arithmetic_rows(7600, 500, digits=2, style="bare", seed=0), DATA, ("parquet",))


def main(overrides: list[str]) -> dict[str, float]:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prepare_data()
    config = load_config(HERE / "config.yaml", overrides)
    with start_ray(config), RLTrainer(config) as trainer:
        return trainer.fit()


if __name__ == "__main__":
    main(sys.argv[1:])
