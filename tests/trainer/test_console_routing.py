"""`hybridflow.metrics.log_routing` in plain processes: what reaches the console and what the log file.

A worker's routing is tested in a child process of its own (it redirects the process's file
descriptors 1 and 2), which writes through every path a worker's output takes: Python prints, raw
file-descriptor writes (C/C++ output), log records and Python warnings, each attributed once to a
library file and once to own code.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from io import StringIO
from pathlib import Path

import torch

import hybridflow.metrics.log_routing as log_routing
from hybridflow.metrics.log_routing import (
    DRIVER_LOG,
    WarningRouter,
    clear_log_dir,
    is_own_source,
    route_driver_output,
    worker_log_file,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
LIBRARY_FILE = torch.__file__

WORKER_SCRIPT = """
import logging, os, sys, warnings
from pathlib import Path
from hybridflow.metrics.log_routing import route_worker_output

path = route_worker_output(Path(sys.argv[1]))
print("plain print")
os.write(1, b"raw fd1 write\\n")
os.write(2, b"raw fd2 write\\n")
library = logging.getLogger("vllm.fake")
library.handle(logging.makeLogRecord({{
    "name": "vllm.fake", "levelno": logging.WARNING, "levelname": "WARNING",
    "pathname": {library!r}, "msg": "library log warning",
}}))
logging.getLogger("hybridflow.fake").warning("own log warning")
logging.getLogger("hybridflow.fake").info("own info, below the level")
warnings.warn_explicit("library python warning", FutureWarning, {library!r}, 1)
warnings.warn("own python warning", UserWarning)
sys.stdout.flush()
sys.stderr.flush()
print(path, file=open(sys.argv[2], "w"))
"""


def test_own_code_is_the_projects_packages_and_code_outside_the_library_folders(tmp_path):
    assert is_own_source(log_routing.__file__)
    assert is_own_source(str(REPO_ROOT / "trainer" / "fit.py"))
    assert is_own_source(str(REPO_ROOT / "workers" / "actor.py"))
    assert is_own_source(str(tmp_path / "my_recipe.py"))
    assert not is_own_source(LIBRARY_FILE)
    assert not is_own_source(warnings.__file__)
    assert not is_own_source("<string>")
    assert not is_own_source("<frozen importlib._bootstrap>")


def test_warning_router_sends_library_warnings_to_the_log_only():
    console, log = StringIO(), StringIO()
    router = WarningRouter(console, log)
    router("deprecated thing", FutureWarning, LIBRARY_FILE, 7, line="")
    router("check your data", UserWarning, log_routing.__file__, 9, line="")
    assert console.getvalue() == f"{log_routing.__file__}:9: UserWarning: check your data\n"
    assert log.getvalue() == (
        f"{LIBRARY_FILE}:7: FutureWarning: deprecated thing\n"
        f"{log_routing.__file__}:9: UserWarning: check your data\n"
    )


def test_a_worker_process_keeps_only_own_warnings_on_its_console(tmp_path):
    script = tmp_path / "worker.py"
    source = WORKER_SCRIPT.format(library=LIBRARY_FILE)
    script.write_text(source)
    own_warning_line = source.splitlines().index('warnings.warn("own python warning", UserWarning)') + 1
    log_dir, answer = tmp_path / "logs", tmp_path / "answer.txt"
    run = subprocess.run(
        [sys.executable, str(script), str(log_dir), str(answer)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert run.returncode == 0, run.stderr
    log_file = Path(answer.read_text().strip())
    assert log_file.parent == log_dir and log_file.name.startswith("worker-")
    # The console (the process's original stdout/stderr) holds the own warnings and nothing else.
    assert run.stdout == ""
    console = run.stderr.splitlines()
    assert len(console) == 3, console
    assert console[0].endswith("WARNING hybridflow.fake: own log warning")
    assert console[1] == f"{script}:{own_warning_line}: UserWarning: own python warning"
    assert console[2].strip() == 'warnings.warn("own python warning", UserWarning)'
    logged = log_file.read_text()
    for line in (
        "plain print",
        "raw fd1 write",
        "raw fd2 write",
        "library log warning",
        "own log warning",
        f"{LIBRARY_FILE}:1: FutureWarning: library python warning",
        "own python warning",
    ):
        assert line in logged
    assert "own info" not in logged


def test_the_driver_sends_library_python_warnings_to_its_log(tmp_path, capsys):
    log_dir = tmp_path / "logs"
    previous = warnings.showwarning
    with route_driver_output(log_dir) as path:
        warnings.warn_explicit("library python warning", FutureWarning, LIBRARY_FILE, 3)
        warnings.warn_explicit("own python warning", UserWarning, __file__, 5)
    assert warnings.showwarning is previous
    with warnings.catch_warnings(record=True):
        warnings.warn_explicit("after the block", UserWarning, LIBRARY_FILE, 4)
    assert path == log_dir / DRIVER_LOG
    console = capsys.readouterr().err
    assert "library python warning" not in console
    assert f"{__file__}:5: UserWarning: own python warning" in console
    logged = path.read_text()
    assert f"{LIBRARY_FILE}:3: FutureWarning: library python warning" in logged
    assert "own python warning" in logged
    assert "after the block" not in logged


def test_clear_log_dir_removes_an_earlier_runs_log_files_only(tmp_path):
    log_dir = tmp_path / "logs"
    clear_log_dir(log_dir)
    old = [worker_log_file(log_dir, 123), worker_log_file(log_dir, 456), log_dir / DRIVER_LOG]
    keep = log_dir / "notes.txt"
    for path in (*old, keep):
        path.write_text("x")
    clear_log_dir(log_dir)
    assert sorted(p.name for p in log_dir.iterdir()) == ["notes.txt"]
