"""Run a program in a bubblewrap sandbox, with rlimits and a seccomp filter, and capture what it prints.

One run, from outside in:

1. ``bwrap`` (Debian package ``bubblewrap``) builds new user, pid, network, IPC, UTS, mount and cgroup
   namespaces, drops every capability, starts a new session, and dies with its parent. Started by root,
   bwrap itself runs as the host user ``nobody`` (uid 65534): the kernel exempts processes of host root
   from the process-count limit, and the sandbox's user (uid 1000 inside) is nobody outside. The file
   tree it shows holds ``/usr`` (read-only, with the ``/bin`` and ``/lib*`` links of a merged-usr
   system), a fresh ``/proc`` and ``/dev``, a synthetic ``/etc/passwd`` and ``/etc/group``, and the
   run's private directory at ``/tmp``: a tmpfs of at most ``max_tmp_bytes``, the only writable place,
   gone with the run (the root and ``/dev`` are remounted read-only). The run's input files appear in
   it read-only. Nothing else of the host is visible: not the project, not ``/root``, not the host's
   ``/etc``.
2. bwrap installs the seccomp filter of :mod:`hybridflow.sandbox.seccomp` (it also sets no-new-privs).
3. ``prlimit`` (util-linux, in ``/usr/bin``) sets the rlimits on itself and execs the program. The CPU
   limit's hard value is one second above its soft one, so SIGXCPU comes first and SIGKILL follows if
   the program ignores it.

The environment holds only ``PATH``, ``HOME`` and ``LANG``. Output is read in chunks as it comes, so a
program printing a gigabyte is killed at ``max_output_bytes`` without the bytes ever being held. On
wall timeout, or when the output cap is passed, the bwrap process is killed (through a pidfd); the sandbox's pid 1 dies
with it (``--die-with-parent``) and the kernel kills every process left in its pid namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

from hybridflow.sandbox.limits import Outcome, SandboxLimits, SandboxResult, SandboxUnavailableError
from hybridflow.sandbox.seccomp import build_filter

__all__ = ["Sandbox"]

_PRLIMIT = "/usr/bin/prlimit"
_UID = 1000
_HOST_UID = 65534  # "nobody": the host user the sandbox runs as when started by root
_PASSWD = f"sandbox:x:{_UID}:{_UID}:sandbox:/tmp:/usr/sbin/nologin\n"
_GROUP = f"sandbox:x:{_UID}:\n"
_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}
_CHUNK = 65536
_MEMORY_ERROR = "MemoryError"


class _Capture:
    """stdout and stderr of one run, read by two threads, kept up to a shared byte cap."""

    def __init__(self, cap: int, on_overflow: Callable[[], None]) -> None:
        self.cap = cap
        self.kept = 0
        self.overflow = False
        self.parts: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self._lock = threading.Lock()
        self._on_overflow = on_overflow

    def read(self, stream: IO[bytes], name: str) -> None:
        """Read ``stream`` to its end; past the cap, keep nothing more and kill the run once."""
        while chunk := stream.read1(_CHUNK):
            with self._lock:
                room = self.cap - self.kept
                self.parts[name].append(chunk[: max(room, 0)])
                self.kept += min(len(chunk), max(room, 0))
                first_overflow = len(chunk) > room and not self.overflow
                self.overflow = self.overflow or len(chunk) > room
            if first_overflow:
                self._on_overflow()

    def text(self, name: str) -> str:
        return b"".join(self.parts[name]).decode("utf-8", errors="replace")


class Sandbox:
    """Runs untrusted code, each run in a sandbox of its own; safe to call from many threads at once.

    Args:
        limits: the default limits of a run (a run may pass its own).
        python: the interpreter that runs code given as text; it must lie under ``/usr``, the only
            host folder the sandbox sees.
        max_workers: threads of the pool behind :meth:`submit` and :meth:`run_async`.

    Raises:
        SandboxUnavailableError: ``bwrap``, ``prlimit``, ``python`` or libseccomp is missing, or a trial run of
            ``/usr/bin/true`` in the sandbox fails (bwrap's message is quoted).
    """

    def __init__(
        self, limits: SandboxLimits | None = None, python: str = "/usr/bin/python3", max_workers: int = 8
    ):
        self.limits = limits if limits is not None else SandboxLimits()
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailableError(
                "bwrap is not installed (Debian package bubblewrap: `apt-get install bubblewrap`, or `make install`); "
                "code is never run without the sandbox"
            )
        if not python.startswith("/usr/") or not os.access(python, os.X_OK):
            raise SandboxUnavailableError(f"sandbox python {python!r} is missing or not under /usr")
        if not os.access(_PRLIMIT, os.X_OK):
            raise SandboxUnavailableError(
                f"{_PRLIMIT} is missing (Debian package util-linux); it sets the rlimits"
            )
        self.bwrap = bwrap
        self.python = python
        self._filter = build_filter()
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox")
        # A kernel without user namespaces, or a bwrap that cannot mount, fails here and not as a program error.
        probe = self.run(["/usr/bin/true"])
        if probe.outcome is not Outcome.OK:
            raise SandboxUnavailableError(
                f"bwrap cannot build the sandbox on this machine: {probe.stderr.strip()}"
            )

    def run(
        self,
        code: str | Sequence[str],
        stdin: str = "",
        files: Mapping[str, str | bytes] | None = None,
        limits: SandboxLimits | None = None,
    ) -> SandboxResult:
        """Run ``code`` once and return how it ended.

        Args:
            code: Python source (run as ``/tmp/main.py`` by the sandbox's python), or an argv whose first
                item is an absolute path inside the sandbox (``["/usr/bin/sleep", "1"]``).
            stdin: text fed to the program's standard input.
            files: more files for the run's directory, by relative name (``{"data.txt": "..."}``); they are
                read-only inside (a program that edits one copies it first).
            limits: this run's limits instead of the sandbox's.
        """
        limits = limits if limits is not None else self.limits
        with tempfile.TemporaryDirectory(prefix="hybridflow-sandbox-") as root:
            work = Path(root, "work")
            work.mkdir()
            for name, content in {
                **(files or {}),
                **({"main.py": code} if isinstance(code, str) else {}),
            }.items():
                target = (work / name).resolve()
                if not target.is_relative_to(work):
                    raise ValueError(f"sandbox file {name!r} lies outside the run's directory")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content.encode() if isinstance(content, str) else content)
            Path(root, "passwd").write_text(_PASSWD)
            Path(root, "group").write_text(_GROUP)
            if os.geteuid() == 0:
                # bwrap runs as nobody, who must read the run's files.
                for path in (Path(root), *Path(root).rglob("*")):
                    os.chown(path, _HOST_UID, _HOST_UID)
            argv = [self.python, "-I", "/tmp/main.py"] if isinstance(code, str) else list(code)
            return self._execute(root, argv, stdin, limits)

    def submit(self, code: str | Sequence[str], **kwargs: Any) -> Future[SandboxResult]:
        """:meth:`run` on the sandbox's thread pool."""
        return self._pool.submit(self.run, code, **kwargs)

    async def run_async(self, code: str | Sequence[str], **kwargs: Any) -> SandboxResult:
        """:meth:`run` awaited from an event loop, on the sandbox's thread pool."""
        return await asyncio.wrap_future(self.submit(code, **kwargs))

    def close(self) -> None:
        """Stop the thread pool after the runs already submitted."""
        self._pool.shutdown(wait=True)

    def _command(self, root: str, argv: list[str], limits: SandboxLimits, filter_fd: int) -> list[str]:
        rlimits = [
            f"--cpu={limits.cpu_seconds}:{limits.cpu_seconds + 1}",
            f"--as={limits.memory_bytes}",
            f"--nproc={limits.max_processes}",
            f"--nofile={limits.max_open_files}",
            f"--fsize={limits.max_file_bytes}",
            "--core=0",
        ]
        work = Path(root, "work")
        inputs = [path.relative_to(work) for path in sorted(work.rglob("*")) if path.is_file()]
        return [
            self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(_UID), "--gid", str(_UID), "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev",
            "--ro-bind", f"{root}/passwd", "/etc/passwd", "--ro-bind", f"{root}/group", "/etc/group",
            "--size", str(limits.max_tmp_bytes), "--tmpfs", "/tmp",
            *[item for name in inputs for item in ("--ro-bind", str(work / name), f"/tmp/{name}")],
            "--chdir", "/tmp",
            "--remount-ro", "/", "--remount-ro", "/dev",
            "--clearenv", *[item for key, value in _ENV.items() for item in ("--setenv", key, value)],
            "--seccomp", str(filter_fd),
            "--", _PRLIMIT, *rlimits, "--", *argv,
        ]  # fmt: skip

    def _execute(self, root: str, argv: list[str], stdin: str, limits: SandboxLimits) -> SandboxResult:
        filter_fd = os.memfd_create("hybridflow-seccomp")
        os.write(filter_fd, self._filter)
        os.lseek(filter_fd, 0, os.SEEK_SET)
        start = time.monotonic()
        try:
            process = subprocess.Popen(
                self._command(root, argv, limits, filter_fd),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env={}, pass_fds=(filter_fd,), start_new_session=True, **_host_user(),
            )  # fmt: skip
        finally:
            os.close(filter_fd)
        # A pidfd names this bwrap process and no other, even after it exits: killing through it cannot hit
        # a reused pid, and polling it waits for the exit without Popen.wait's sleep-and-retry latency.
        pidfd = os.pidfd_open(process.pid)
        capture = _Capture(limits.max_output_bytes, lambda: _kill(pidfd))
        threads = [
            threading.Thread(target=capture.read, args=(process.stdout, "stdout"), daemon=True),
            threading.Thread(target=capture.read, args=(process.stderr, "stderr"), daemon=True),
        ]
        if stdin:
            threads.append(threading.Thread(target=_feed, args=(process.stdin, stdin.encode()), daemon=True))
        else:
            process.stdin.close()
        for thread in threads:
            thread.start()
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        timed_out = not poller.poll(limits.wall_seconds * 1000)
        if timed_out:
            _kill(pidfd)
        process.wait()
        for thread in threads:
            thread.join()
        os.close(pidfd)  # after the readers, the last to kill through it
        seconds = time.monotonic() - start
        process.stdout.close()
        process.stderr.close()
        stdout, stderr = capture.text("stdout"), capture.text("stderr")
        exit_code = _exit_code(process.returncode)
        outcome = _outcome(exit_code, stderr, timed_out, capture.overflow, seconds, limits)
        return SandboxResult(
            outcome, stdout, stderr, None if timed_out or capture.overflow else exit_code, seconds
        )


def _host_user() -> dict[str, object]:
    """Popen's arguments that start bwrap as nobody when this process is root, else none."""
    if os.geteuid() != 0:
        return {}
    return {"user": _HOST_UID, "group": _HOST_UID, "extra_groups": []}


def _kill(pidfd: int) -> None:
    """SIGKILL bwrap (alone in its session); the sandbox's pid namespace dies with it."""
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write stdin and close it; a program that exits without reading it closes the pipe first."""
    try:
        pipe.write(data)
        pipe.close()
    except (BrokenPipeError, OSError):
        pass


def _exit_code(returncode: int) -> int:
    """The program's exit status, ``-signal`` when a signal ended it (bwrap reports those as 128 + signal)."""
    return -(returncode - 128) if returncode > 128 else returncode


def _outcome(
    exit_code: int, stderr: str, timed_out: bool, overflow: bool, seconds: float, limits: SandboxLimits
) -> Outcome:
    if overflow:
        return Outcome.OUTPUT_LIMIT
    if timed_out:
        return Outcome.TIMEOUT
    if exit_code == 0:
        return Outcome.OK
    if exit_code == -signal.SIGXCPU or (exit_code == -signal.SIGKILL and seconds >= limits.cpu_seconds):
        return Outcome.CPU_LIMIT
    if exit_code < 0:
        return Outcome.KILLED
    lines = stderr.strip().splitlines()
    if lines and lines[-1].startswith(_MEMORY_ERROR):
        return Outcome.MEMORY_LIMIT
    return Outcome.ERROR
