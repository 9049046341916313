"""The reinforce_pp recipe (`python -m recipes.reinforce_pp.main`); README.md describes it."""
