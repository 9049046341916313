"""The rloo recipe (`python -m recipes.rloo.main`); README.md describes it."""
