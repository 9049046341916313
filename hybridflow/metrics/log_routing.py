"""Where a run's output goes: the console for what a person reads, a log folder for the rest.

A quiet run (``trainer.console: quiet``) keeps the console to the progress bar, the metric lines and
real warnings; everything else lands in the run's log folder (``<trainer.output_dir>/logs``):

- **Worker processes** (`route_worker_output`, run by Ray's worker set-up hook before any task) send
  their standard output and error to ``worker-<pid>.log``. The redirection is of file descriptors 1
  and 2, so it holds whatever writes there: vLLM's and Ray's log lines, weight-loading progress bars,
  C++ messages (NUMA binding, oneDNN) and library warnings. What is the project's own
  (`is_own_source`) still reaches the console: warning and error log records, and Python warnings,
  raised from its code are written to the process's original standard error, which Ray forwards to
  the driver (prefixed ``(pid=...)``).
- **The driver** (`route_driver_output`) keeps its console for the progress bar, the metric lines and
  its own warnings; Python warnings raised inside libraries go to ``driver.log``.

Own code is the ``hybridflow``, ``workers`` and ``trainer`` packages and any code outside the Python
installation's library folders (a recipe's script, a user's module); library code is the rest.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

import hybridflow

__all__ = [
    "DRIVER_LOG",
    "LOG_DIR",
    "OwnRecordFilter",
    "WarningRouter",
    "clear_log_dir",
    "is_own_source",
    "route_driver_output",
    "route_worker_output",
    "worker_log_file",
    "worker_output_hook",
]

LOG_DIR = "logs"
"""The log folder's name, under the run's output folder."""

DRIVER_LOG = "driver.log"
"""The driver's log file, in the log folder."""

# The three packages ship from one distribution, side by side.
_OWN_ROOTS = tuple(
    str(Path(hybridflow.__file__).resolve().parents[1] / package) + os.sep
    for package in ("hybridflow", "trainer", "workers")
)
_LIBRARY_ROOTS = tuple(
    str(Path(path).resolve()) + os.sep
    for path in {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    if path
)
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def is_own_source(path: str) -> bool:
    """Whether the code file ``path`` is the project's own (see the module docstring); a name that is
    not a file path (``<string>``, ``<frozen ...>``) counts as a library's."""
    if not os.path.isabs(path):
        return False
    resolved = str(Path(path).resolve())
    if resolved.startswith(_OWN_ROOTS):
        return True
    return not resolved.startswith(_LIBRARY_ROOTS)


class OwnRecordFilter(logging.Filter):
    """Passes the log records emitted from the project's own code (`is_own_source` of the record's file)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return is_own_source(record.pathname)


class WarningRouter:
    """A ``warnings.showwarning`` that writes every warning to ``log`` and those raised from own code
    (`is_own_source`) to ``console`` as well, in the standard ``file:line: Category: message`` format."""

    def __init__(self, console: TextIO, log: TextIO) -> None:
        self.console = console
        self.log = log

    def __call__(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        for stream in (self.console, self.log) if is_own_source(filename) else (self.log,):
            stream.write(text)
            stream.flush()


def worker_log_file(log_dir: Path, pid: int) -> Path:
    """The log file of the worker process ``pid``."""
    return log_dir / f"worker-{pid}.log"


def clear_log_dir(log_dir: Path) -> None:
    """Create ``log_dir``, or remove the log files an earlier run left there (``driver.log`` and every
    ``worker-<pid>.log``), so that it holds one run's files."""
    log_dir.mkdir(parents=True, exist_ok=True)
    for old in (*log_dir.glob("worker-*.log"), log_dir / DRIVER_LOG):
        old.unlink(missing_ok=True)


def route_worker_output(log_dir: Path) -> Path:
    """Send this process's standard output and error to its log file in ``log_dir``, and own warnings
    to the original standard error (see the module docstring). Returns the log file.

    Meant for a process that does nothing else with its console (a Ray worker); not undone.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    path = worker_log_file(log_dir, os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, sys.stdout.fileno())
    os.dup2(log_fd, sys.stderr.fileno())
    os.close(log_fd)
    to_console = logging.StreamHandler(console)
    to_console.setLevel(logging.WARNING)
    to_console.addFilter(OwnRecordFilter())
    to_console.setFormatter(logging.Formatter(_FORMAT))
    # The root logger's records otherwise reach nobody once it has a handler (no last-resort output).
    to_log = logging.StreamHandler(sys.stderr)
    to_log.setFormatter(logging.Formatter(_FORMAT))
    root = logging.getLogger()
    root.addHandler(to_console)
    root.addHandler(to_log)
    warnings.showwarning = WarningRouter(console, sys.stderr)
    return path


def worker_output_hook(log_dir: Path) -> Callable[[], None]:
    """`route_worker_output` for ``log_dir`` as a no-argument function, the form of Ray's
    ``runtime_env["worker_process_setup_hook"]`` (Ray pickles it to every worker of the job)."""

    def route_output_to_log_dir() -> None:
        route_worker_output(log_dir)

    return route_output_to_log_dir


@contextmanager
def route_driver_output(log_dir: Path) -> Iterator[Path]:
    """While open, Python warnings raised inside libraries go to ``log_dir/driver.log`` instead of the
    console, and warning log records of every logger are copied there. Yields the log file's path;
    the previous ``warnings.showwarning`` comes back on exit."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / DRIVER_LOG
    previous = warnings.showwarning
    with path.open("a", buffering=1) as log:
        copy = logging.StreamHandler(log)
        copy.setLevel(logging.WARNING)
        copy.setFormatter(logging.Formatter(_FORMAT))
        root = logging.getLogger()
        root.addHandler(copy)
        warnings.showwarning = WarningRouter(sys.stderr, log)
        try:
            yield path
        finally:
            warnings.showwarning = previous
            root.removeHandler(copy)
