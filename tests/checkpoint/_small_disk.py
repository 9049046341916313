"""A small file system of a fixed size, mounted for one test (tmpfs; needs the right to mount)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(path: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size_bytes`` at ``path`` for the duration of the block; skips the test
    where this process may not mount."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def fill(disk: Path, leave_bytes: int) -> None:
    """Write a file that leaves about ``leave_bytes`` free on ``disk``."""
    import shutil

    free = shutil.disk_usage(disk).free
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave_bytes))
