"""The tool_arithmetic recipe (`python -m recipes.tool_arithmetic.main`); README.md describes it.

Importing it registers the recipe's environment, ``calculator_arithmetic``."""

from recipes.tool_arithmetic import environment as environment
