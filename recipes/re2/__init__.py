"""The re2 recipe (`python -m recipes.re2.main`); README.md describes it."""
