"""`keep_freed_host_memory`: a block above glibc's largest mmap threshold (32 MiB), allocated, touched
and freed again and again, is faulted in page by page every time by default and not at all once the
process keeps what it frees. Each case runs in a fresh interpreter: the setting is process-wide."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from hybridflow.resharding.memory import _LIBC

BLOCK_BYTES = 64 * 2**20  # over the 32 MiB ceiling of the dynamic mmap threshold: always mmapped by default
CYCLES = 5
WARM_UP = 8

CHILD = f"""
import resource, sys
import torch
from hybridflow.resharding.memory import keep_freed_host_memory

if sys.argv[1] == "keep":
    assert keep_freed_host_memory()

def cycle():
    block = torch.ones({BLOCK_BYTES // 4})  # allocated, touched, freed
    del block

# The first cycles fault pages in either way: the heap grows until a freed block fits the next aligned
# request (3-4 cycles measured).
for _ in range({WARM_UP}):
    cycle()
faults = []
for _ in range({CYCLES}):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycle()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
# The median cycle: now and then the heap still grows once after the warm-up (one block's pages in one
# cycle), which says nothing about the steady state.
print(sorted(faults)[len(faults) // 2])
"""


def _faults_per_cycle(mode: str) -> float:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


@pytest.mark.skipif(getattr(_LIBC, "mallopt", None) is None, reason="the C library is not glibc (no mallopt)")
def test_kept_memory_is_not_faulted_in_again():
    block_pages = BLOCK_BYTES / resource.getpagesize()
    by_default = _faults_per_cycle("default")
    kept = _faults_per_cycle("keep")
    assert by_default > 0.9 * block_pages, (by_default, block_pages)
    assert kept < 0.01 * block_pages, (kept, block_pages)
