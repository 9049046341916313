"""The dapo recipe (`python -m recipes.dapo.main`); README.md describes it."""
