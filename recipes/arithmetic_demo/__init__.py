"""The arithmetic_demo recipe (`python -m recipes.arithmetic_demo.main`); README.md describes it."""
