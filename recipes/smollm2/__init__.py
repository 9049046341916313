"""The smollm2 recipe (`python -m recipes.smollm2.main`); README.md describes it."""
