"""The Python interpreter tool runs code in the sandbox and reports the outcome by name."""

from __future__ import annotations

import pytest

from hybridflow.sandbox import SandboxLimits
from hybridflow.tools import PythonInterpreter, ToolOutcome, make_tool
from hybridflow.tools.python_interpreter import extract_code


@pytest.fixture(scope="module")
def interpreter():
    tool = PythonInterpreter(SandboxLimits(cpu_seconds=2, memory_bytes=256 * 2**20))
    yield tool
    tool.sandbox.close()


def test_prints_come_back(interpreter):
    result = interpreter.call("print(sum(range(101)))", timeout=10.0)
    assert (result.observation, result.outcome) == ("[ok]\n5050\n", ToolOutcome.OK)


def test_fenced_code_is_extracted(interpreter):
    text = "I will compute it.\n```python\nprint(6 * 7)\n```\n"
    assert extract_code(text) == "print(6 * 7)\n"
    assert interpreter.call(text, timeout=10.0).observation == "[ok]\n42\n"


def test_exception_is_an_error_with_its_traceback(interpreter):
    result = interpreter.call("1 / 0", timeout=10.0)
    assert result.outcome is ToolOutcome.ERROR
    assert result.observation.startswith("[error exit=1]\n[stderr]\n")
    assert result.observation.rstrip().endswith("ZeroDivisionError: division by zero")


def test_timeout_is_the_call_timeout(interpreter):
    result = interpreter.call("import time\ntime.sleep(30)", timeout=1.0)
    assert (result.observation, result.outcome) == ("[timeout]", ToolOutcome.TIMEOUT)
    assert result.seconds < 5.0


def test_registered_by_name():
    tool = make_tool("python")
    try:
        assert isinstance(tool, PythonInterpreter)
    finally:
        tool.sandbox.close()
