"""A recipe's own settings: the free-form ``recipe`` section of the run config, checked like the rest.

A recipe declares its settings as a frozen dataclass (defaults and bounds beside each field, as in
`trainer.config.schema`) and reads them once::

    @dataclass(frozen=True)
    class DapoSettings:
        max_rounds: int = recipe_field(4, ge=1)

    settings = recipe_settings(config, DapoSettings)   # config.recipe.max_rounds, or 4

Unknown keys, wrong types and values out of bounds raise one `ConfigError` naming each ``recipe.<key>``.
"""

from __future__ import annotations

from typing import TypeVar

from hybridflow.config_fields import config_field
from trainer.config.convert import build
from trainer.config.problems import Problems
from trainer.config.schema import RunConfig

__all__ = ["recipe_field", "recipe_settings"]

T = TypeVar("T")

recipe_field = config_field
"""A dataclass field with its default and numeric bounds (``ge``, ``gt``, ``le``), checked on load."""


def recipe_settings(config: RunConfig, cls: type[T]) -> T:
    """Build the recipe's settings dataclass ``cls`` from ``config.recipe``.

    Raises:
        ConfigError: listing every problem, each under its full key (``recipe.<field>``).
    """
    problems = Problems()
    settings = build(cls, config.recipe, "recipe", problems)
    problems.raise_if_any()
    return settings
