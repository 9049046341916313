"""Tools a model calls during an episode.

- :mod:`~hybridflow.tools.base`: :class:`Tool`, :class:`ToolResult`, :class:`ToolOutcome`;
- :mod:`~hybridflow.tools.registry`: tools by name (:func:`register_tool`, :func:`make_tool`);
- :mod:`~hybridflow.tools.calculator`: ``calculator``, arithmetic parsed with ``ast``;
- :mod:`~hybridflow.tools.python_interpreter`: ``python``, code run in :mod:`hybridflow.sandbox`.

See docs/sandbox.md.
"""

from hybridflow.tools.base import Tool, ToolOutcome, ToolResult
from hybridflow.tools.calculator import Calculator, CalculatorError, evaluate
from hybridflow.tools.python_interpreter import PythonInterpreter
from hybridflow.tools.registry import TOOLS, get_tool, make_tool, register_tool

__all__ = [
    "TOOLS",
    "Calculator",
    "CalculatorError",
    "PythonInterpreter",
    "Tool",
    "ToolOutcome",
    "ToolResult",
    "evaluate",
    "get_tool",
    "make_tool",
    "register_tool",
]
