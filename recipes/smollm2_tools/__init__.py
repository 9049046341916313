"""The smollm2_tools recipe (`python -m recipes.smollm2_tools.main`); README.md describes it."""
