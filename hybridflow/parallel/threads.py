"""Torch's OpenMP threads for one thread of a process, leaving every other thread at the default.

``torch.set_num_threads(n)`` sets a process-wide count that every thread adopts at its first parallel
op, the helper threads of gloo's process groups included (they copy and reduce collective buffers).
Each such thread then starts an OpenMP team of its own, and once a process holds more OpenMP threads
than CPUs, libgomp stops spin-waiting between parallel regions in every team: a parallel op waits for
its sleeping threads to wake. Measured in a two-thread training worker on 2 cores: 45-65 us per small
parallel op instead of 7 us, and the 3.1M model's bf16 GRPO step 1.24-1.46 s instead of 1.00 s
(docs/parallel.md).

`set_this_thread_torch_threads` instead sets the count of the calling thread alone (OpenMP's
per-thread ``omp_set_num_threads``). With ``OMP_NUM_THREADS=1`` in the process's environment, the
other threads then run their parallel ops alone and start no team.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

__all__ = ["set_this_thread_torch_threads"]


def _torch_libgomp() -> ctypes.CDLL | None:
    """The GNU OpenMP runtime torch was loaded with (``torch/lib/libgomp*.so*``), or None."""
    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    candidates = sorted((Path(torch.__file__).parent / "lib").glob("libgomp*.so*"))
    # Loading a library by the path it was loaded from returns the same handle, not a second copy.
    return ctypes.CDLL(str(candidates[0])) if candidates else None


def set_this_thread_torch_threads(threads: int) -> bool:
    """Make torch compute with ``threads`` threads in the calling thread only.

    Returns False, after falling back to the process-wide ``torch.set_num_threads(threads)``, where
    torch's parallel backend is not a GNU OpenMP runtime this function can reach (macOS builds, for
    one).
    """
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    runtime = _torch_libgomp()
    if runtime is not None:
        # Torch sets a thread's count from the process-wide one at its first parallel op; doing that
        # first keeps it from overwriting the count set here.
        torch.get_num_threads()
        runtime.omp_set_num_threads(threads)
        if torch.get_num_threads() == threads:
            return True
    torch.set_num_threads(threads)
    return False
