"""Errors that reach the controller from its worker groups."""

from __future__ import annotations

__all__ = ["WorkerDiedError", "WorkerError", "WorkerGroupDeadError"]


class WorkerError(RuntimeError):
    """A registered method raised on a worker.

    Attributes:
        rank: the rank that raised (the first one the controller heard from).
        role: the role (worker group) the method belongs to.
        method: the method's name.
        cause: the original exception, when it could be rebuilt on the controller.
        remote_traceback: the worker-side traceback as text.
    """

    def __init__(
        self, rank: int, role: str, method: str, cause: BaseException | None, remote_traceback: str
    ) -> None:
        self.rank = rank
        self.role = role
        self.method = method
        self.cause = cause
        self.remote_traceback = remote_traceback
        summary = f"{type(cause).__name__}: {cause}" if cause is not None else "an error"
        super().__init__(
            f"{role}.{method} raised on rank {rank}: {summary}\n--- worker traceback ---\n{remote_traceback}"
        )


class WorkerDiedError(RuntimeError):
    """A worker process died (crashed, was killed, or exited) while a call was in flight.

    The group's remaining processes are stopped as well: a group with a missing rank cannot run
    collectives, and waiting on them would hang.
    """

    def __init__(self, rank: int, role: str, method: str, detail: str) -> None:
        self.rank = rank
        self.role = role
        self.method = method
        super().__init__(
            f"the worker process of rank {rank} died during {role}.{method}; the worker group was shut "
            f"down. Detail: {detail}"
        )


class WorkerGroupDeadError(RuntimeError):
    """A call was made on a worker group that was shut down (after a worker died, or on request)."""
