"""PPO with a critic and GAE, and an adaptive KL penalty in the reward.

A config-only recipe: everything that makes the algorithm is in config.yaml (see README.md), and this
script only writes the data and runs the configured step (`trainer.main.run_config_file`). With the
data in place the same config runs from the command line: `python -m trainer.main --config recipes/ppo/config.yaml`.

Run:  python -m recipes.ppo.main [key=value overrides of config.yaml]
(or python recipes/ppo/main.py ...)
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridflow.data.synthetic import ensure_arithmetic_splits
from trainer.main import run_config_file

HERE = Path(__file__).resolve().parent
DATA = Path(".cache/recipes/ppo/data")  # config.yaml's data.train_files / val_files point here


def main(overrides: list[str]) -> dict[str, float]:
    ensure_arithmetic_splits(DATA)  # 2-digit addition, bare style ("47+38=" -> "85")
    return run_config_file(HERE / "config.yaml", overrides)


if __name__ == "__main__":
    main(sys.argv[1:])
