"""Host memory of this process as the memory planner counts it, and its peak over a block of code.

On CPU the planner's estimates are bytes that are allocated and not yet freed: the host counterpart of
CUDA's allocated memory. glibc's ``mallinfo2`` reports exactly that (heap chunks in use plus mmapped
chunks; torch's CPU tensors, vLLM's weights and KV cache all come from malloc). The resident set adds
what glibc keeps of freed memory for reuse. `benchmarks/bench_memory_plan.py` and the planner's tests
measure with these.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

from hybridflow.resharding.memory import return_freed_host_memory

__all__ = ["HostPeakSampler", "anonymous_resident_bytes", "live_heap_bytes"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_LIBC.mallinfo2.restype = _MallInfo2


def live_heap_bytes() -> int:
    """Bytes allocated and not yet freed through malloc (heap chunks in use plus mmapped chunks)."""
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


def anonymous_resident_bytes() -> int:
    """Resident anonymous memory (resident minus file-backed and shared pages)."""
    with open("/proc/self/statm") as statm:
        fields = statm.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


class HostPeakSampler:
    """The highest live-heap bytes (``live``) and anonymous resident bytes (``resident``) of this
    process while the block runs, sampled every ``interval_s`` seconds (1 ms) by a thread; the
    levels at entry are ``start_live`` and ``start_resident`` (after freed memory is handed back)."""

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s

    def __enter__(self) -> HostPeakSampler:
        return_freed_host_memory()
        self.start_live, self.start_resident = live_heap_bytes(), anonymous_resident_bytes()
        self.live, self.resident = self.start_live, self.start_resident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        self.live = max(self.live, live_heap_bytes())
        self.resident = max(self.resident, anonymous_resident_bytes())

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
