"""The run config's keys, listed from the schema, and a valid setup to mutate one key of."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from hybridflow.data import write_rows
from trainer.config import RunConfig

ROW = {
    "data_source": "toy",
    "prompt": [{"role": "user", "content": "1+1="}],
    "reward_model": {"style": "rule", "ground_truth": "2"},
}
REWARD_FILE = "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"


def _section_type(tp: Any) -> type | None:
    """The dataclass behind an annotation (``X`` or ``X | None``), or None for a leaf."""
    if get_origin(tp) in (Union, types.UnionType):
        inner = [arg for arg in get_args(tp) if arg is not type(None)]
        tp = inner[0] if len(inner) == 1 else None
    return tp if dataclasses.is_dataclass(tp) else None


def schema_keys(cls: type = RunConfig, prefix: str = "") -> dict[str, bool]:
    """Every dotted key of ``cls``: True for a section (a mapping of keys), False for a leaf value."""
    keys: dict[str, bool] = {}
    hints = get_type_hints(cls)
    for field in dataclasses.fields(cls):
        key = f"{prefix}{field.name}"
        section = _section_type(hints[field.name])
        keys[key] = section is not None
        if section is not None:
            keys.update(schema_keys(section, f"{key}."))
    return keys


def valid_setup(root: Path) -> dict[str, str]:
    """Overrides (key -> value) of a config that loads: data files, a reward file, an output folder."""
    root.mkdir(parents=True, exist_ok=True)
    reward = root / "reward.py"
    reward.write_text(REWARD_FILE)
    return {
        "data.train_files": f"[{write_rows([ROW] * 4, root / 'train.parquet')}]",
        "data.val_files": f"[{write_rows([ROW] * 2, root / 'val.jsonl')}]",
        "data.max_prompt_length": "8",
        "data.max_response_length": "8",
        "model.tiny.max_position_embeddings": "64",
        "reward.default_fn": f"{reward}:score",
        "trainer.output_dir": str(root / "run"),
    }


def override_list(setup: dict[str, str]) -> list[str]:
    return [f"{key}={value}" for key, value in setup.items()]
