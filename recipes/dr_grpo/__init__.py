"""The dr_grpo recipe (`python -m recipes.dr_grpo.main`); README.md describes it."""
