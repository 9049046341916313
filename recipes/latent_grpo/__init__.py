"""The latent_grpo recipe (`python -m recipes.latent_grpo.main`); README.md describes it."""
