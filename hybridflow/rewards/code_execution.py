"""Code-execution rewards: run the model's code against test cases, each run in the sandbox.

``ground_truth`` is a list of test cases (or that list as JSON text, or ``{"tests": [...]}``). A case is
either

- ``{"stdin": "...", "stdout": "..."}``: the program reads ``stdin`` and passes when its output equals
  ``stdout``, compared line by line with trailing spaces and trailing blank lines dropped; or
- ``{"assert": "assert add(2, 3) == 5"}``: the case's code runs after the program's, and passes when the
  run exits with status 0.

The program is the last fenced code block of the response (```` ```python ... ``` ````), or the whole
response without one. Every case is a separate sandbox run under :data:`CASE_LIMITS`; the cases of one
response run concurrently. A case that times out, passes a limit or crashes fails, and is counted.

Two registered names:

- ``code_execution``: the fraction of cases passed;
- ``code_execution_all``: 1.0 when every case passes, else 0.0.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from hybridflow.rewards.registry import register_reward_function
from hybridflow.sandbox import Outcome, Sandbox, SandboxLimits, SandboxResult
from hybridflow.tools.python_interpreter import extract_code

__all__ = ["CASE_LIMITS", "CodeReport", "code_execution_all_reward", "code_execution_reward", "run_cases"]

CASE_LIMITS = SandboxLimits(
    cpu_seconds=2, wall_seconds=4.0, memory_bytes=256 * 2**20, max_output_bytes=16 * 2**10
)
"""The limits of one test case's run."""


@dataclasses.dataclass(frozen=True)
class CodeReport:
    """The cases of one response: how many passed, failed (any reason) and, of the failed, timed out or hit a limit."""

    passed: int
    failed: int
    timeouts: int
    limits_hit: int

    @property
    def fraction(self) -> float:
        """Passed over all cases; 0.0 for no cases."""
        total = self.passed + self.failed
        return self.passed / total if total else 0.0


@functools.cache
def _sandbox() -> Sandbox:
    return Sandbox(CASE_LIMITS)


def _cases(ground_truth: Any) -> list[Mapping[str, str]]:
    cases = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    if isinstance(cases, Mapping):
        cases = cases.get("tests")
    if not isinstance(cases, Sequence) or not all(isinstance(case, Mapping) for case in cases):
        raise ValueError(f"code-execution ground_truth must be a list of test cases, got {ground_truth!r}")
    for index, case in enumerate(cases):
        if not ({"stdin", "stdout"} <= set(case) or "assert" in case):
            raise ValueError(
                f"code-execution test case {index} has neither stdin/stdout nor assert: {case!r}"
            )
    return list(cases)


def _normalise(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _passes(case: Mapping[str, str], result: SandboxResult) -> bool:
    if result.outcome is not Outcome.OK:
        return False
    return "assert" in case or _normalise(result.stdout) == _normalise(case["stdout"])


def run_cases(
    code: str, cases: Sequence[Mapping[str, str]], sandbox: Sandbox, limits: SandboxLimits
) -> CodeReport:
    """Run ``code`` against every case, concurrently on ``sandbox``'s pool, under ``limits``."""
    futures = [
        sandbox.submit(f"{code}\n\n{case['assert']}\n", limits=limits)
        if "assert" in case
        else sandbox.submit(code, stdin=case["stdin"], limits=limits)
        for case in cases
    ]
    results = [future.result() for future in futures]
    passed = sum(_passes(case, result) for case, result in zip(cases, results, strict=True))
    limit_outcomes = {Outcome.CPU_LIMIT, Outcome.MEMORY_LIMIT, Outcome.OUTPUT_LIMIT}
    return CodeReport(
        passed=passed,
        failed=len(cases) - passed,
        timeouts=sum(result.outcome is Outcome.TIMEOUT for result in results),
        limits_hit=sum(result.outcome in limit_outcomes for result in results),
    )


@register_reward_function("code_execution")
def code_execution_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """The fraction of ``ground_truth``'s test cases the response's code passes (see the module docstring)."""
    return run_cases(extract_code(solution_str), _cases(ground_truth), _sandbox(), CASE_LIMITS).fraction


@register_reward_function("code_execution_all")
def code_execution_all_reward(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    """1.0 when the response's code passes every test case of ``ground_truth``, else 0.0."""
    report = run_cases(extract_code(solution_str), _cases(ground_truth), _sandbox(), CASE_LIMITS)
    return float(report.failed == 0 and report.passed > 0)


# A worker builds the sandbox (and the seccomp filter) once at start, outside any sample's time limit.
code_execution_reward.prepare = _sandbox  # type: ignore[attr-defined]
code_execution_all_reward.prepare = _sandbox  # type: ignore[attr-defined]
