"""trainer/'s imports point one way: runtime <- steps (and validation) <- algorithms <- fit <- the CLI.

Every import statement counts, those under ``if TYPE_CHECKING:`` and inside functions included: a cycle
that only type checkers see is still a cycle in the design.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

PACKAGE = REPO_ROOT / "trainer"

LAYERS = ["trainer.runtime", "trainer.steps", "trainer.algorithms", "trainer.fit", "trainer.main"]
"""From the bottom up: a module may import the ones before it, never one after it."""

SAME_LAYER = {"trainer.validation": "trainer.steps"}
"""Modules that sit in another's layer."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The trainer modules ``path`` (module ``name``) imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for candidate in candidates:
            # ``import trainer.fit`` names trainer.fit; ``from trainer.fit import fit`` names the module too.
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name and candidate != "trainer":
                targets.add(candidate)
    return targets


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_walk_sees_imports_under_type_checking_and_in_functions(tmp_path):
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from trainer.fit import fit\n"
        "def late():\n    import trainer.algorithms\n"
        "from . import steps\n"
    )
    path = tmp_path / "trainer" / "runtime.py"
    path.parent.mkdir()
    path.write_text(source)
    known = {"trainer.fit", "trainer.algorithms", "trainer.steps", "trainer.runtime"}
    assert imported("trainer.runtime", path, known) == {"trainer.fit", "trainer.algorithms", "trainer.steps"}


def test_a_cycle_is_found():
    graph = {"trainer.a": {"trainer.b"}, "trainer.b": {"trainer.c"}, "trainer.c": {"trainer.a"}}
    assert find_cycle(graph) == ["trainer.a", "trainer.b", "trainer.c", "trainer.a"]
    assert find_cycle({"trainer.a": {"trainer.b"}, "trainer.b": set()}) is None


def test_trainer_has_no_import_cycle():
    graph = import_graph()
    assert {"trainer.runtime", "trainer.steps", "trainer.fit"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


@pytest.mark.parametrize("lower", LAYERS[:-1])
def test_a_layer_reaches_no_layer_above_it(lower):
    graph = import_graph()
    above = set(LAYERS[LAYERS.index(lower) + 1 :])
    members = [lower, *(name for name, layer in SAME_LAYER.items() if layer == lower)]
    for member in members:
        assert not reachable(graph, member) & above, f"{member} imports {sorted(reachable(graph, member) & above)}"


def test_the_steps_import_the_runtime_for_real():
    # The steps' type of their first argument is a real import, so the layers above are real too.
    assert "trainer.runtime" in import_graph()["trainer.steps"]


def test_no_module_imports_under_type_checking():
    offenders = [
        name
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
    ]
    assert offenders == []
