"""A Python interpreter tool: the model's code runs in the sandbox, and what it printed comes back.

The argument is Python source; when it holds a fenced block (```` ```python ... ``` ````), the last
such block is the code. The observation is :meth:`~hybridflow.sandbox.SandboxResult.describe`:
``[ok]`` or the sandbox's named outcome (``[timeout]``, ``[memory_limit]``, ...), then the output.
"""

from __future__ import annotations

import dataclasses
import re

from hybridflow.sandbox import Outcome, Sandbox, SandboxLimits
from hybridflow.tools.base import Tool, ToolOutcome, ToolResult
from hybridflow.tools.registry import register_tool

__all__ = ["PythonInterpreter", "extract_code"]

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block of ``text``, or all of ``text`` when it has none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


@register_tool("python")
class PythonInterpreter(Tool):
    """Runs code in a :class:`~hybridflow.sandbox.Sandbox`; the call's timeout is the run's wall limit.

    Args:
        limits: the sandbox limits apart from wall time.
        sandbox: a sandbox to share with other tools (one is built otherwise).
    """

    description = "Run Python code in a sandbox without network or files; returns what it prints."

    def __init__(self, limits: SandboxLimits | None = None, sandbox: Sandbox | None = None):
        self.sandbox = sandbox if sandbox is not None else Sandbox(limits)
        self.limits = limits if limits is not None else self.sandbox.limits

    def call(self, argument: str, timeout: float) -> ToolResult:
        """Run the code; outcome ``ok`` on exit 0, ``timeout`` past ``timeout`` seconds, ``error`` otherwise."""
        limits = dataclasses.replace(self.limits, wall_seconds=timeout)
        result = self.sandbox.run(extract_code(argument), limits=limits)
        outcome = {Outcome.OK: ToolOutcome.OK, Outcome.TIMEOUT: ToolOutcome.TIMEOUT}.get(
            result.outcome, ToolOutcome.ERROR
        )
        return ToolResult(result.describe(), outcome, result.seconds)
