"""The trainer's command line (``python -m trainer.main``) as the kill-and-resume tests run it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 600
"""The longest one run of the tiny task may take, start-up included, on a loaded 2-core host."""


def start_driver(config: Path, log: Path) -> subprocess.Popen:
    """Start ``python -m trainer.main --config config`` in the repository, its output into ``log``."""
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.main", "--config", str(config)],
        cwd=REPO_ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )


def run_to_the_end(config: Path, log: Path) -> str:
    """Run the command to completion (it must exit 0); returns its output."""
    driver = start_driver(config, log)
    try:
        code = driver.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    output = log.read_text()
    assert code == 0, output[-4000:]
    return output


def wait_for_file(driver: subprocess.Popen, path: Path, log: Path) -> None:
    """Return once ``path`` exists (polled every 50 ms); fails if the driver ends first or after
    `RUN_TIMEOUT_S`."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not path.exists():
        assert driver.poll() is None, f"the run ended before writing {path}: {log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {path} after {RUN_TIMEOUT_S} s"
        time.sleep(0.05)
