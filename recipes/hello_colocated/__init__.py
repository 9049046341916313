"""The hello_colocated recipe (`python -m recipes.hello_colocated.main`); README.md describes it."""
