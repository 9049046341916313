"""Removes what a local Ray cluster leaves behind once the process that started it is gone.

`trainer.ray_runtime.start_ray` runs this file as a separate process, ``python ray_watchdog.py TEMP_DIR
DRIVER_PID``, with a pipe on its standard input whose other end only the driver holds. The read returns
when the driver closes it at the end of the run, or when the driver dies (the kernel closes the pipe
even on SIGKILL). Then every process still using the run's Ray temp folder (by its command line, working
folder or open files), the driver excepted, gets SIGTERM, then SIGKILL, and the folder is removed.

Why it is needed: on the driver's death Ray's head processes and workers stop within seconds, but the
raylet's two agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) outlive it by minutes (measured
here: over 60 s, 190 MB), and nothing removes the temp folder. The agents rename their command lines, so
their open log files are what ties them to the run.

Only the standard library is imported: the watchdog starts in milliseconds and holds little memory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

__all__ = [
    "DRIVER_FILE",
    "SUPPORTED",
    "is_stale",
    "process_identity",
    "processes_using",
    "record_driver",
    "sweep",
]

DRIVER_FILE = "driver.pid"
"""File in a run's Ray temp folder naming the driver: ``"<pid> <start time>"``."""

SUPPORTED = Path("/proc/self/stat").is_file()
"""Whether this system has the Linux ``/proc`` file system that finding a run's processes relies on."""

_GRACE_S = 2.0
_SWEEP_LIMIT_S = 30.0


def process_identity(pid: int) -> str | None:
    """``"<pid> <start time>"`` of a live process, or None if there is none. The start time (clock ticks
    since boot) tells a reused process id from the process that had it before."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The start time is field 22; fields are counted after the command name, which may hold spaces.
    return f"{pid} {stat.rsplit(')', 1)[1].split()[19]}"


def record_driver(folder: str | Path) -> None:
    """Name this process as the driver of the run whose Ray temp folder is ``folder``."""
    identity = process_identity(os.getpid())
    assert identity is not None  # this very process
    (Path(folder) / DRIVER_FILE).write_text(identity)


def is_stale(folder: str | Path) -> bool:
    """Whether ``folder`` names a driver (`record_driver`) that is gone. A folder naming none is not
    stale: it may belong to a run still starting, or to another tool."""
    try:
        driver = (Path(folder) / DRIVER_FILE).read_text().strip()
        pid = int(driver.split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return process_identity(pid) != driver


def _is_under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")


def _uses(pid: int, folder: str) -> bool:
    proc = f"/proc/{pid}"
    try:
        if os.stat(proc).st_uid != os.getuid():
            return False
        with open(f"{proc}/cmdline", "rb") as file:
            arguments = file.read().decode(errors="replace").split("\0")
        if any(argument.endswith(folder) or folder + "/" in argument for argument in arguments):
            return True
        if _is_under(os.readlink(f"{proc}/cwd"), folder):
            return True
        return any(_is_under(os.readlink(f"{proc}/fd/{fd}"), folder) for fd in os.listdir(f"{proc}/fd"))
    except OSError:
        # The process ended while being looked at, or its details are not ours to read.
        return False


def processes_using(folder: str | Path, spare: tuple[int, ...] = ()) -> list[int]:
    """Process ids of this user's processes whose command line names ``folder``, or whose working folder
    or an open file lies under it; this process and those in ``spare`` are left out."""
    folder = str(Path(folder).absolute())
    left_out = {os.getpid(), *spare}
    return sorted(
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and int(entry) not in left_out and _uses(int(entry), folder)
    )


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def sweep(folder: str | Path, spare: tuple[int, ...] = ()) -> None:
    """Stop every process using ``folder`` but those in ``spare`` (SIGTERM, then SIGKILL after a grace
    period), until none is left or the time limit passes, then remove ``folder``."""
    deadline = time.monotonic() + _SWEEP_LIMIT_S
    terminated_at: dict[int, float] = {}
    while (pids := processes_using(folder, spare)) and time.monotonic() < deadline:
        now = time.monotonic()
        _signal_all([pid for pid in pids if pid not in terminated_at], signal.SIGTERM)
        for pid in pids:
            terminated_at.setdefault(pid, now)
        _signal_all([pid for pid in pids if now - terminated_at[pid] >= _GRACE_S], signal.SIGKILL)
        time.sleep(0.1)
    shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group; the driver's end of the pipe decides.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    folder, driver = sys.argv[1], int(sys.argv[2])
    sys.stdin.buffer.read()
    # After a clean end the driver still holds Ray's log files of its own session.
    sweep(folder, spare=(driver,))


if __name__ == "__main__":
    main()
