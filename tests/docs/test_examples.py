"""The code the README and the guides show is checked against the code it describes.

* Every ```python block parses; every name it imports exists; every call of an imported function or
  class binds to the callable's real signature (keywords that exist, no missing positional argument).
* Every method row of docs/workers.md (`` `name(params)` `` under a ``## `Class` (`module`)`` heading)
  names a public method of that class with exactly those parameters and defaults.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUIDES = sorted([REPO / "README.md", *REPO.glob("docs/*.md"), *REPO.glob("recipes/*/README.md")])
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path: Path) -> Iterator[tuple[int, str]]:
    """``(first line number, source)`` of every ```python block of ``path``."""
    text = path.read_text()
    for match in FENCE.finditer(text):
        yield text.count("\n", 0, match.start(1)) + 1, match.group(1)


def _resolve(node: ast.expr, names: dict[str, object]) -> object | None:
    """The object a ``Name`` or dotted ``Attribute`` chain denotes, when it starts at an imported name."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, names)
        if owner is not None and (inspect.ismodule(owner) or inspect.isclass(owner)):
            return getattr(owner, node.attr, None)
    return None


def _bind_errors(call: ast.Call, target: object) -> str | None:
    """Why ``call`` cannot bind to ``target``'s signature, or None when it can (or cannot be judged)."""
    if any(isinstance(arg, ast.Starred) for arg in call.args) or any(kw.arg is None for kw in call.keywords):
        return None
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(len(call.args)), **{kw.arg: None for kw in call.keywords})
    except TypeError as error:
        return str(error)
    return None


def check_block(source: str) -> list[str]:
    """Problems of one block: a syntax error, an import that fails, a call that does not bind."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return [f"line {error.lineno}: does not parse: {error.msg}"]
    names: dict[str, object] = {}
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            try:
                module = importlib.import_module(node.module)
            except ImportError as error:
                problems.append(f"line {node.lineno}: from {node.module} import ...: {error}")
                continue
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if value is None:
                    try:
                        value = importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        problems.append(f"line {node.lineno}: {node.module} has no {alias.name!r}")
                        continue
                names[alias.asname or alias.name] = value
        elif isinstance(node, ast.Import):
            for alias in node.names:
                try:
                    module = importlib.import_module(alias.name)
                except ImportError as error:
                    problems.append(f"line {node.lineno}: import {alias.name}: {error}")
                    continue
                names[alias.asname or alias.name.split(".")[0]] = (
                    module if alias.asname else importlib.import_module(alias.name.split(".")[0])
                )
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            target = _resolve(node.func, names)
            if target is not None and callable(target):
                error = _bind_errors(node, target)
                if error:
                    problems.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {error}")
    return problems


EXAMPLES = [
    pytest.param(path, line, source, id=f"{path.relative_to(REPO)}:{line}")
    for path in GUIDES
    for line, source in python_blocks(path)
]


@pytest.mark.parametrize(("path", "line", "source"), EXAMPLES)
def test_code_example_matches_the_code(path: Path, line: int, source: str) -> None:
    problems = check_block(source)
    assert not problems, f"{path.relative_to(REPO)}, block at line {line}:\n" + "\n".join(problems)


def test_checker_catches_a_wrong_keyword_and_a_missing_name() -> None:
    assert check_block("from hybridflow.algos import masked_mean\nmasked_mean(1, 2, axis=0)")
    assert check_block("from hybridflow.algos import no_such_function")
    assert not check_block("from hybridflow.algos import masked_mean\nmasked_mean(1, 2, dim=0)")


# ---------------------------------------------------------------------------- docs/workers.md tables

CLASS_HEADING = re.compile(r"^## `(\w+)` \(`([\w/]+)\.py`\)$", re.MULTILINE)
METHOD_ROW = re.compile(r"^\| `(\w+)\((.*?)\)` \|", re.MULTILINE)


def documented_methods(text: str) -> Iterator[tuple[str, str, str, str]]:
    """``(module, class, method, documented parameters)`` of every method row under a class heading."""
    headings = list(CLASS_HEADING.finditer(text))
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        section = text[heading.end() : following.start() if following else len(text)]
        module = heading.group(2).replace("/", ".")
        for row in METHOD_ROW.finditer(section):
            yield module, heading.group(1), row.group(1), row.group(2)


def actual_parameters(method: object) -> str:
    """The method's parameters as docs/workers.md writes them: ``name``, ``name=default``, a bare ``*``
    before keyword-only ones; ``self`` left out."""
    parts: list[str] = []
    starred = False
    for parameter in list(inspect.signature(method).parameters.values())[1:]:
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not starred:
            parts.append("*")
            starred = True
        default = parameter.default
        text = parameter.name if default is inspect.Parameter.empty else f"{parameter.name}={default!r}"
        parts.append(text.replace("'", '"'))
    return ", ".join(parts)


WORKER_ROWS = list(documented_methods((REPO / "docs" / "workers.md").read_text()))


def test_workers_doc_has_method_rows() -> None:
    assert len(WORKER_ROWS) >= 15


@pytest.mark.parametrize(("module", "cls", "method", "params"), WORKER_ROWS, ids=lambda v: str(v))
def test_worker_method_signature_is_documented(module: str, cls: str, method: str, params: str) -> None:
    owner = getattr(importlib.import_module(module), cls)
    assert hasattr(owner, method), f"docs/workers.md lists {cls}.{method}, which does not exist"
    actual = actual_parameters(getattr(owner, method))
    assert params == actual, f"docs/workers.md shows {cls}.{method}({params}); the code has ({actual})"


def test_every_recipe_is_listed() -> None:
    recipes = sorted(p.parent.name for p in REPO.glob("recipes/*/main.py"))
    table = (REPO / "docs" / "recipes.md").read_text()
    unlisted = [name for name in recipes if f"(../recipes/{name}/README.md)" not in table and name != "hello_colocated"]
    assert not unlisted, f"docs/recipes.md's table lacks {unlisted}"
