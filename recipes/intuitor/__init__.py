"""The intuitor recipe (`python -m recipes.intuitor.main`); README.md describes it."""
