"""The synthetic task of the Re² recipe, and the warm start that gives a tiny model its rare redo habit.

**Task.** 2-digit addition, bare style ("47+38=" -> "85", exact match), written digit by digit from the
leading digit. A digit once written cannot be taken back, and any wrong digit makes the whole answer
wrong, so after a wrong start no continuation can be right: the only way to a correct answer is a fresh
attempt. The model can tell: the sum it would compute disagrees with the digit on the page, so the
decision to restart can depend on what was written. This is the situation Re² trains for, in its
smallest form (README.md).

**Warm start.** A freshly warm-started model has never seen the redo phrase and never writes it, so
there is nothing for RL to amplify (the paper starts from models that redo 0.5% of the time). A short
supervised phase on top of the arithmetic demo's warm start teaches the phrase as a rare, blind habit:
a share of the training answers become one random digit followed by the phrase, whatever the question.
Whether to redo *after a wrong digit* is left to RL.

**Instruction.** The paper's prompt tells the model it may give up with the phrase. A 3.2M character
model cannot read that, so the measured runs go without; `with_redo_instruction` puts it in front of
every question as a system message, for models that can (``recipe.instruction: true``, README.md).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from hybridflow.data import read_rows
from hybridflow.data.files import write_rows
from hybridflow.data.synthetic import ensure_arithmetic_splits
from hybridflow.models import load_causal_lm, load_tokenizer_dir, save_model_dir
from recipes.re2.re2_redo import REDO_PHRASE
from trainer.warm_start import WarmStartConfig, file_digest, warm_start, warm_start_folder

__all__ = [
    "REDO_INSTRUCTION",
    "RedoWarmStart",
    "ensure_task",
    "instructed_copy",
    "redo_rows",
    "redo_warm_start_key",
    "redo_warm_started_model",
    "tokenizer_digest",
    "with_redo_instruction",
]

RECORD_FILE = "redo_warm_start.json"
REDO_INSTRUCTION = 'If an attempt goes wrong, you may give up by saying "{phrase}" and the question is asked again.'


def ensure_task(data_dir: Path) -> Path:
    """The task's ``train.parquet`` and ``test.parquet`` under ``data_dir`` (the arithmetic demo's split:
    7,600 training and 500 held-out problems), written once."""
    return ensure_arithmetic_splits(data_dir)


def with_redo_instruction(rows: Sequence[dict], phrase: str = REDO_PHRASE) -> list[dict]:
    """``rows`` whose chat prompt starts with a system message telling the model it may say ``phrase``
    to give up; everything else is left as it was."""
    system = {"role": "system", "content": REDO_INSTRUCTION.format(phrase=phrase)}
    return [{**row, "prompt": [system, *row["prompt"]]} for row in rows]


def instructed_copy(path: Path, phrase: str, cache: Path) -> Path:
    """The rows of the data file ``path`` with `with_redo_instruction` applied, written once to
    ``cache/instructed-<hash>/<name>``: the hash covers the phrase and the file's bytes, so another
    phrase or another file gets its own copy."""
    key = hashlib.sha256(f"{phrase}\0{file_digest([str(path)])}".encode()).hexdigest()[:12]
    target = cache / f"instructed-{key}" / Path(path).name
    if not target.exists():
        write_rows(with_redo_instruction(read_rows(path), phrase), target)
    return target


@dataclass(frozen=True)
class RedoWarmStart:
    """The supervised phase that adds the redo habit.

    Attributes:
        share: fraction of training answers replaced by a random digit and the redo phrase.
        steps, batch_size, lr, seed: of the AdamW steps (`trainer.warm_start.warm_start`).
        max_position_embeddings: the model's position limit, raised so that prompt + prefix + response
            fit (rotary positions: the weights do not depend on it).
        phrase: the redo phrase.
    """

    share: float = 0.15
    steps: int = 100
    batch_size: int = 64
    lr: float = 5e-4
    seed: int = 0
    max_position_embeddings: int = 128
    phrase: str = REDO_PHRASE


def redo_rows(rows: Sequence[dict], share: float, seed: int, phrase: str = REDO_PHRASE) -> list[dict]:
    """``rows`` with the ground truth of a random ``share`` of them replaced by a digit (1-9, at random)
    followed by ``phrase``: a redo after a first digit that is as often wrong as right for the question."""
    rng = random.Random(seed)
    out = []
    for row in rows:
        if rng.random() < share:
            answer = f"{rng.choice('123456789')}{phrase}"
            row = {**row, "reward_model": {**row["reward_model"], "ground_truth": answer}}
        out.append(row)
    return out


def tokenizer_digest(tokenizer: PreTrainedTokenizerBase) -> str:
    """SHA-256 (hex) of what decides how ``tokenizer`` writes a text: its vocabulary, its special tokens
    and its chat template."""
    described = {
        "vocab": tokenizer.get_vocab(),
        "special": {name: str(value) for name, value in tokenizer.special_tokens_map.items()},
        "chat_template": tokenizer.chat_template,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def redo_warm_start_key(base_dir: Path, data_dir: Path, config: RedoWarmStart) -> dict[str, object]:
    """What decides `redo_warm_started_model`'s checkpoint, by part: ``base`` (the base's weights file),
    ``tokenizer`` (`tokenizer_digest` of the base's tokenizer: another tokenizer writes the redo phrase
    in other tokens, or not at all), ``train`` (the training split's bytes) and ``config``."""
    return {
        "base": file_digest([str(base_dir / "model.safetensors")]),
        "tokenizer": tokenizer_digest(load_tokenizer_dir(base_dir)),
        "train": file_digest([str(data_dir / "train.parquet")]),
        "config": asdict(config),
    }


def redo_warm_started_model(
    base_dir: Path, data_dir: Path, cache_dir: Path, config: RedoWarmStart
) -> tuple[Path, float]:
    """``base_dir`` (a warm-started model) after the redo phase on ``data_dir``'s training split, and its
    held-out greedy exact-match accuracy; cached in ``cache_dir/redo`` under `redo_warm_start_key`, in
    the folder `trainer.warm_start.warm_start_folder` names."""
    target = warm_start_folder(cache_dir / "redo", redo_warm_start_key(base_dir, data_dir, config))
    if (target / RECORD_FILE).exists():
        return target, json.loads((target / RECORD_FILE).read_text())["accuracy"]
    tokenizer = load_tokenizer_dir(base_dir)
    train = redo_rows(read_rows(data_dir / "train.parquet"), config.share, config.seed, config.phrase)
    held_out = read_rows(data_dir / "test.parquet")
    with tempfile.TemporaryDirectory(prefix="redo-warm-start-") as scratch:
        model = load_causal_lm(base_dir)
        model.config.max_position_embeddings = config.max_position_embeddings
        start = save_model_dir(model, tokenizer, Path(scratch) / "start")
        phase = WarmStartConfig(
            steps=config.steps, batch_size=config.batch_size, lr=config.lr, seed=config.seed
        )
        if target.exists():
            shutil.rmtree(target)  # an interrupted earlier run left it without its record
        result = warm_start(start, tokenizer, train, held_out, target, phase)
    (target / RECORD_FILE).write_text(
        json.dumps({"config": asdict(config), "accuracy": result.accuracy}, indent=1)
    )
    return target, result.accuracy
