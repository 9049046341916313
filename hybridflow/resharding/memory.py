"""Peak-memory measurement around a layout switch.

On GPU the peak is the CUDA allocator's ``max_memory_allocated`` since the tracker started. On CPU
there is no allocator counter, so a sampling thread reads the process's resident set size (RSS)
every ``interval_s`` and the highest reading is the peak; callers also sample at the points where
memory is known to be highest (a bucket gathered and not yet freed) with `PeakMemoryTracker.sample`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

import torch

__all__ = [
    "PeakMemoryTracker",
    "current_memory_bytes",
    "keep_freed_host_memory",
    "process_peak_memory_bytes",
    "return_freed_host_memory",
    "trim_host_memory_above",
]

T = TypeVar("T")

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
_LIBC_NAME = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_LIBC_NAME) if _LIBC_NAME else None


def return_freed_host_memory() -> None:
    """Hand memory that was freed back to the operating system (glibc's ``malloc_trim``).

    glibc keeps freed blocks of its heap for reuse, so host memory freed after each streamed bucket
    would still count as resident and pile up across buckets. Trimming keeps the process's real
    footprint at what is alive. A no-op where the C library has no ``malloc_trim``.
    """
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1  # mallopt takes a C int


def keep_freed_host_memory() -> bool:
    """Make glibc keep the memory this process frees for its next allocations (process-wide).

    By default glibc serves every block over its mmap threshold (at most 32 MiB) with a fresh mapping
    and unmaps it on free, and gives the top of its heap back to the kernel past a trim threshold. A
    training step allocates and frees the same large buffers (gradients, gathered weights, logits)
    every micro-batch, so each one is faulted in again page by page: on SmolLM2-135M's bf16 update
    about 2 million minor faults and 6 of its 23 CPU seconds in the kernel (docs/parallel.md). After
    this call every block comes from the heap and nothing is trimmed automatically; the resident size
    stays at the process's high-water mark. An explicit `return_freed_host_memory` still hands freed
    pages back (the resharding manager does so around vLLM). Returns False where the C library has no
    ``mallopt`` (not glibc), having changed nothing.
    """
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    # 1 is success; the mmap count first, so that a failure leaves the trim threshold as it was.
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX))


def trim_host_memory_above(items: Iterable[T], ceiling_bytes: int) -> Iterator[T]:
    """Pass ``items`` through; whenever the consumer comes back for the next one and the process's
    RSS is above ``ceiling_bytes``, hand freed heap memory back first (`return_freed_host_memory`).

    A consumer that allocates and frees transient copies per item (vLLM's CPU weight reload) leaves
    them in glibc's heap, where fragmentation lets RSS creep up item after item. Trimming after every
    item would bound that too, but each trim makes the next allocations fault their pages in again;
    trimming only above a ceiling keeps both the footprint and the number of trims small.
    """
    for item in items:
        yield item
        if _rss_bytes() > ceiling_bytes:
            return_freed_host_memory()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE_BYTES


def current_memory_bytes(device: torch.device) -> int:
    """Allocated device memory on GPU, resident set size on CPU (bytes)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return _rss_bytes()


def process_peak_memory_bytes(device: torch.device) -> int:
    """The most memory this process has held since it started (bytes): the CUDA allocator's peak on
    GPU, the kernel's high-water mark of the resident set (``ru_maxrss``) on CPU, where it counts
    everything in the process (an engine sharing it included)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class PeakMemoryTracker:
    """Context manager recording the start and peak memory (bytes) of the enclosed block.

    On CPU it first trims the heap (`return_freed_host_memory`) so that the rise counts memory the
    block reuses from earlier phases; with ``trim_first=False`` it does not, and the rise counts only
    memory beyond what the process already held.
    """

    def __init__(self, device: torch.device, interval_s: float = 0.002, trim_first: bool = True) -> None:
        self.device = device
        self.interval_s = interval_s
        self.trim_first = trim_first
        self.start_bytes = 0
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The sampler thread and `restart` both write `peak_bytes`.
        self._lock = threading.Lock()

    def sample(self) -> None:
        """Fold the memory seen so far into the peak (on GPU: the allocator's peak since reset)."""
        with self._lock:
            if self.device.type == "cuda":
                self.peak_bytes = max(self.peak_bytes, torch.cuda.max_memory_allocated(self.device))
            else:
                self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    def restart(self) -> int:
        """Start a new window inside the block: ``start_bytes`` and ``peak_bytes`` restart from the
        memory in use now (on GPU the allocator's peak counter is reset). Returns the peak of the
        window that ends, so the caller can combine the two."""
        self.sample()
        with self._lock:
            previous_peak = self.peak_bytes
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = self.peak_bytes = current_memory_bytes(self.device)
        return previous_peak

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> PeakMemoryTracker:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.trim_first:
            # Freed-but-resident heap (e.g. the last update's activations) would otherwise be reused
            # by the block without showing in RSS, and the measured rise would understate its cost.
            return_freed_host_memory()
        self.start_bytes = self.peak_bytes = current_memory_bytes(self.device)
        if self.device.type != "cuda":
            self._thread = threading.Thread(target=self._poll, name="rss-sampler", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.sample()

    @property
    def extra_peak_bytes(self) -> int:
        """How far above its starting level memory rose during the block."""
        return max(0, self.peak_bytes - self.start_bytes)
