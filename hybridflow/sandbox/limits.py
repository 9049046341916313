"""What one sandboxed execution may use, and what it came back with.

:class:`SandboxLimits` is a config section (frozen dataclass, bounds declared beside each field);
:class:`SandboxResult` carries the named :class:`Outcome` of one run.
"""

from __future__ import annotations

import dataclasses
import enum

from hybridflow.config_fields import check_bounds, config_field

__all__ = ["Outcome", "SandboxLimits", "SandboxResult", "SandboxUnavailableError"]


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot be built on this machine (a program or library it needs is missing).

    Raised instead of running anything: code is never run unsandboxed.
    """


class Outcome(str, enum.Enum):
    """How a sandboxed run ended."""

    OK = "ok"
    """Exit status 0."""
    ERROR = "error"
    """Nonzero exit status (an exception, ``sys.exit(1)``, a refused system call that was not handled)."""
    TIMEOUT = "timeout"
    """Wall time ran past ``wall_seconds``; every process of the run was killed."""
    CPU_LIMIT = "cpu_limit"
    """CPU time ran past ``cpu_seconds`` (the kernel sent SIGXCPU, then SIGKILL)."""
    MEMORY_LIMIT = "memory_limit"
    """An allocation past ``memory_bytes`` failed and the program died of it (Python's ``MemoryError``)."""
    OUTPUT_LIMIT = "output_limit"
    """stdout and stderr together passed ``max_output_bytes``; the run was killed and the output cut there."""
    KILLED = "killed"
    """Ended by a signal other than the CPU limit's."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one execution. Sizes are bytes, times seconds.

    ``cpu_seconds``, ``memory_bytes`` (address space), ``max_processes``, ``max_open_files`` and
    ``max_file_bytes`` (largest file the run may write) are rlimits set inside the sandbox before the
    program starts; ``max_tmp_bytes`` is the size of the run's writable ``/tmp`` (a tmpfs, so it is
    memory, counted apart from ``memory_bytes``). ``wall_seconds`` and ``max_output_bytes`` are enforced from outside: the run is killed
    when either is passed.
    """

    cpu_seconds: int = config_field(5, ge=1)
    wall_seconds: float = config_field(10.0, gt=0)
    memory_bytes: int = config_field(512 * 2**20, ge=64 * 2**20)
    max_processes: int = config_field(16, ge=1)
    max_open_files: int = config_field(64, ge=16)
    max_file_bytes: int = config_field(16 * 2**20, ge=0)
    max_tmp_bytes: int = config_field(64 * 2**20, ge=2**20)
    max_output_bytes: int = config_field(64 * 2**10, ge=1)

    def __post_init__(self) -> None:
        check_bounds(self, "sandbox")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """One run: its outcome, its captured output (each stream cut so both fit ``max_output_bytes``),
    its exit status (``-signal`` when a signal ended it, None when killed from outside) and its wall seconds."""

    outcome: Outcome
    stdout: str
    stderr: str
    exit_code: int | None
    seconds: float

    def describe(self) -> str:
        """The run as text for a model to read: ``[outcome]`` and the output streams."""
        parts = [f"[{self.outcome.value}" + (f" exit={self.exit_code}]" if self.exit_code else "]")]
        if self.stdout:
            parts.append(self.stdout)
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr}")
        return "\n".join(parts)
