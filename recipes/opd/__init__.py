"""The on-policy distillation recipe (`python -m recipes.opd.main`); README.md describes it."""
