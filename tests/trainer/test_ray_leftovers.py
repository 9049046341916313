"""A local Ray cluster leaves nothing behind when its driver is killed, and a later start removes the
temp folders of dead runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer.ray_runtime import TEMP_PREFIX, remove_stale_temp_dirs
from trainer.ray_watchdog import DRIVER_FILE, record_driver

REPO_ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import os, sys, time
import ray
from trainer.config import RunConfig, TrainerConfig
from trainer.ray_runtime import start_ray

with start_ray(RunConfig(trainer=TrainerConfig(console="verbose"))):
    @ray.remote
    def pid():
        return os.getpid()

    ray.get(pid.remote())  # a worker process exists too
    print(ray._private.worker._global_node.get_temp_dir_path(), flush=True)
    time.sleep(600)
"""


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process, as ``ps`` shows them."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines():
        pid, ppid, *args = line.split(None, 2)
        table[int(pid)] = (int(ppid), args[0] if args else "")
    return table


def descendants(table: dict[int, tuple[int, str]], root: int) -> set[int]:
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, (ppid, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def test_a_killed_driver_leaves_no_ray_process_and_no_temp_folder():
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        temp_dir = driver.stdout.readline().strip()
        assert temp_dir.startswith(f"/tmp/{TEMP_PREFIX}"), temp_dir
        table = process_table()
        ray_processes = descendants(table, driver.pid)
        # gcs, raylet, the agents and the worker, at least.
        assert len(ray_processes) >= 5, table
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 15.0
        while True:
            table = process_table()
            alive = {pid: table[pid][1] for pid in ray_processes if pid in table}
            named = {pid: args for pid, (_, args) in table.items() if temp_dir in args}
            if not alive and not named and not Path(temp_dir).exists():
                break
            assert time.monotonic() < deadline, (
                f"still there after 15 s: {alive} {named} {Path(temp_dir).exists()}"
            )
            time.sleep(0.5)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_a_start_removes_the_temp_folders_of_dead_drivers_only(tmp_path):
    dead, live, reused, unnamed = (
        tmp_path / f"{TEMP_PREFIX}{name}" for name in ("dead", "live", "reused", "x")
    )
    for folder in (dead, live, reused, unnamed):
        folder.mkdir()
    # A driver that has exited, and a process of its run still using the folder.
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from trainer.ray_watchdog import record_driver; record_driver(sys.argv[1])",
            str(dead),
        ],
        cwd=REPO_ROOT,
        check=True,
    )
    straggler = subprocess.Popen(["sleep", "300"], cwd=dead)
    record_driver(live)
    # This process's id, but another start time: the id was reused by a new process.
    (reused / DRIVER_FILE).write_text(f"{os.getpid()} 1")
    try:
        assert remove_stale_temp_dirs(tmp_path) == [dead, reused]
        assert straggler.wait(timeout=10) == -signal.SIGTERM
    finally:
        if straggler.poll() is None:
            straggler.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, unnamed.name]
