"""The grpo recipe (`python -m recipes.grpo.main`); README.md describes it."""
