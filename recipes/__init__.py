"""Recipes: one folder per algorithm variant, each a runnable `main.py`, its `config.yaml` and a README."""
