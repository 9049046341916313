"""Held-out skills for the smollm2 recipe: arithmetic it was not tuned on, to check that its defaults hold.

The recipe's config was chosen on sums up to 20. Each skill here is another operation or operand range,
asked the same way ("What is 27 - 9?", scored by ``exact_match`` on the last number), with 100 held-out
problems and the rest to train on. The skills differ in how often SmolLM2-135M-Instruct gets them right
before training (greedy held-out, and T=1 samples), measured by ``benchmarks/bench_smollm2_skills.py``:
two are *rare-reward* skills, where under 5% of the samples are right at the start (README.md,
"Defaults that hold off the tuned task").

Run a skill:  python -m recipes.smollm2.skills difference [key=value overrides of config.yaml]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from hybridflow.data.synthetic import arithmetic_rows, write_splits
from recipes.smollm2.main import CACHE, HERE, prepare
from trainer.main import run_config_file

__all__ = ["SKILLS", "Skill", "prepare_skill", "skill_overrides", "write_skill_data"]

NUM_TEST = 100
MAX_TRAIN = 2000


@dataclass(frozen=True)
class Skill:
    """One arithmetic skill: ``op`` on operands ``0..max_operand`` (or of exactly ``digits`` digits)."""

    op: str
    max_operand: int | None = None
    digits: int = 2

    def problems(self) -> int:
        """How many distinct problems the skill has."""
        count = self.max_operand + 1 if self.max_operand is not None else 9 * 10 ** (self.digits - 1)
        return count * count


SKILLS = {
    "difference": Skill("-", max_operand=30),  # results -30..30: negatives half the time (rare reward)
    "product": Skill("*", max_operand=15),  # times tables up to 15 x 15
    "two_digit_sum": Skill("+", digits=2),  # 10..99 + 10..99, answers up to 198 (rare reward)
}


def write_skill_data(name: str, folder: Path) -> None:
    """Write skill ``name``'s ``train.parquet`` (every other problem, at most 2,000) and ``test.parquet``
    (100 problems) into ``folder``, fixed by seed 0."""
    if name not in SKILLS:
        raise KeyError(f"unknown skill {name!r}; known: {sorted(SKILLS)}")
    skill = SKILLS[name]
    splits = arithmetic_rows(
        min(skill.problems() - NUM_TEST, MAX_TRAIN),
        NUM_TEST,
        digits=skill.digits,
        ops=(skill.op,),
        seed=0,
        style="question",
        max_operand=skill.max_operand,
    )
    write_splits(splits, folder, ("parquet",))


def prepare_skill(name: str, cache: Path = CACHE) -> Path:
    """The model (converted once) and the skill's data under ``cache/skills/name`` (written once); returns
    the data folder."""
    prepare(cache)
    folder = cache / "skills" / name
    if not (folder / "test.parquet").exists():
        write_skill_data(name, folder)
    return folder


def skill_overrides(folder: Path) -> list[str]:
    """The config overrides that point the recipe at a skill's data ``folder``."""
    return [f"data.train_files=[{folder / 'train.parquet'}]", f"data.val_files=[{folder / 'test.parquet'}]"]


def main(argv: list[str]) -> dict[str, float]:
    if not argv or argv[0] not in SKILLS:
        raise SystemExit(f"usage: python -m recipes.smollm2.skills {{{','.join(SKILLS)}}} [key=value ...]")
    folder = prepare_skill(argv[0])
    return run_config_file(HERE / "config.yaml", [*skill_overrides(folder), *argv[1:]])


if __name__ == "__main__":
    main(sys.argv[1:])
