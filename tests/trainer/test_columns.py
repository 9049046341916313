"""The column vocabulary lives in `hybridflow.contract`: controller steps name columns from there and
import no worker internals."""

from __future__ import annotations

import ast
from pathlib import Path

from hybridflow import contract

ROOT = Path(__file__).resolve().parents[2]
# The loss protocol is the one worker module a controller step may name: it types `update_actor`'s loss.
ALLOWED_WORKER_MODULES = {"workers.objective"}


def imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_controller_steps_import_no_worker_internals():
    for name in ("trainer/steps.py", "trainer/validation.py"):
        workers = {m for m in imported_modules(ROOT / name) if m.split(".")[0] == "workers"}
        assert workers <= ALLOWED_WORKER_MODULES, f"{name} imports {sorted(workers - ALLOWED_WORKER_MODULES)}"


def test_every_named_column_group_is_described_in_the_vocabulary():
    named = {*contract.MODEL_INPUTS, *contract.LOG_PROB_COLUMNS, contract.ADVANTAGES, contract.LOSS_MASK}
    assert named <= contract.COLUMNS.keys()
    assert contract.MODEL_INPUTS == ("input_ids", "attention_mask", "responses", "response_mask")
