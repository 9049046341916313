"""Loading a user's reward function from a Python file."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["load_reward_function"]


def load_reward_function(path: str | os.PathLike[str], name: str) -> Callable[..., Any]:
    """The callable ``name`` defined in the Python file ``path``.

    The file runs as a module of its own (registered in ``sys.modules`` under a name derived from its
    absolute path, so dataclasses and pickling inside it work). Errors name the file and the function:
    FileNotFoundError for a missing file, ImportError when the file fails to run, AttributeError when
    it defines no ``name`` and TypeError when ``name`` is not callable.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"reward function file {str(path)!r} does not exist")
    module_name = "hybridflow_custom_reward_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {str(path)!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            del sys.modules[module_name]
            raise ImportError(f"reward function file {str(path)!r} failed to load: {error!r}") from error
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"reward function file {str(path)!r} defines no {name!r}; it defines {defined}")
    if not callable(fn):
        raise TypeError(f"{name!r} in {str(path)!r} is a {type(fn).__name__}, not a function")
    return fn
