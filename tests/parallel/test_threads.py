"""`set_this_thread_torch_threads` sets the calling thread's torch threads and no other thread's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybridflow.parallel.threads import set_this_thread_torch_threads

_REPORT = """
import json, sys, threading, torch
from hybridflow.parallel.threads import set_this_thread_torch_threads
if sys.argv[1] == "this_thread":
    reached = set_this_thread_torch_threads(3)
else:
    torch.set_num_threads(3)
    reached = None
seen = {}
helper = threading.Thread(target=lambda: seen.update(threads=torch.get_num_threads()))
helper.start()
helper.join()
print(json.dumps([reached, torch.get_num_threads(), seen["threads"]]))
"""


def _report(mode: str) -> list:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _REPORT, mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_only_the_calling_thread_gets_the_threads():
    assert _report("this_thread") == [True, 3, 1]
    # What it replaces: the process-wide setting reaches every thread that computes.
    assert _report("process_wide") == [None, 3, 3]


def test_a_thread_count_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1, got 0"):
        set_this_thread_torch_threads(0)
