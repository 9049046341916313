"""The ppo recipe (`python -m recipes.ppo.main`); README.md describes it."""
