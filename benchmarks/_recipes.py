"""Import a recipe's main.py as a module in a benchmark (recipes are scripts, not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def load_recipe(name: str) -> ModuleType:
    """``recipes/<name>/main.py`` as the module ``recipe_<name>``, imported once."""
    module_name = f"recipe_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, RECIPES / name / "main.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]
