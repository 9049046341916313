"""A rollout worker that dies fails the run with a named error within 30 s and leaves nothing running.

A split run (trainer on `global`, the HF engine on a pool of its own) is started; the rollout process
is killed with SIGKILL; the next generation (its weight push first) must raise `WorkerDiedError` naming
the ``rollout`` role, within 30 s rather than the collective's half-hour timeout, and after the runtime
closes no process of either pool may be left.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from hybridflow.controller import WorkerDiedError
from tests.rollout_service.test_split_grpo import COMMON, SPLIT
from tests.trainer._runs import run_config, write_task
from trainer.runtime import Runtime
from trainer.steps import generate


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_dead_rollout_worker_is_named_and_nothing_is_left(ray_cluster, tmp_path):
    root = write_task(tmp_path)
    config = run_config(root, "hf", 2, [*COMMON, *SPLIT, f"trainer.output_dir={root / 'run'}"])
    with Runtime(config) as runtime:
        pids = runtime.actor.pids + runtime.rollout.pids
        runtime.begin_step()
        generate(runtime, runtime.next_prompts())  # a working push and generation first
        os.kill(runtime.rollout.pids[0], signal.SIGKILL)
        runtime.begin_step()
        started = time.monotonic()
        with pytest.raises(WorkerDiedError) as raised:
            generate(runtime, runtime.next_prompts())
        assert time.monotonic() - started < 30
        assert "rollout" in str(raised.value)
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in pids if _alive(pid)]
