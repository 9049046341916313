"""A quiet run's console, end to end: a real 2-rank GRPO step with vLLM, started through `start_ray`.

The run is a script in a child process, so that the test sees exactly what a person at the console
sees: the driver's stdout and stderr, with what Ray forwards from the workers. The script's actor
class logs one warning per rank from its own code and the driver raises an own and a library Python
warning; the engine logs its usual start-up lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from hybridflow.metrics import read_jsonl
from hybridflow.metrics.log_routing import DRIVER_LOG, LOG_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]

# vLLM's log format: "INFO 12-01 00:40:02 [file.py:123] message" (after an optional process prefix).
VLLM_LINE = re.compile(r"\b(DEBUG|INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[[\w./]+:\d+\]")

RUN_SCRIPT = """
import logging, sys, warnings
from pathlib import Path

import torch

from tests.trainer._runs import run_config, write_task
from trainer.ray_runtime import start_ray
from trainer.fit import fit
from trainer.runtime import Runtime
from trainer.algorithms import rl_step
from workers.actor import ActorRolloutRefWorker


class WarningActor(ActorRolloutRefWorker):
    def init_model(self):
        logging.getLogger("recipe.worker").warning("own worker warning from rank %d", self.rank)
        return super().init_model()


def main(root):
    logging.basicConfig(level=logging.WARNING)
    config = run_config(
        write_task(root),
        "vllm",
        steps=1,
        # Eager: vLLM's compile would only slow the engine's start; the lines looked for are logged either way.
        extra=["trainer.loggers=[console,jsonl]", "trainer.console=quiet", "rollout.enforce_eager=true"],
    )
    with start_ray(config) as ray_start:
        warnings.warn("own driver warning")
        warnings.warn_explicit("library driver warning", FutureWarning, torch.__file__, 1)
        with Runtime(config, {"actor_rollout": WarningActor}, {"ray": ray_start.seconds}) as runtime:
            fit(runtime, rl_step)
    print("run finished")


if __name__ == "__main__":  # the reward pool's processes import this module again
    main(Path(sys.argv[1]))
"""


def test_a_quiet_run_keeps_engine_output_in_its_log_folder_and_warnings_on_the_console(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(RUN_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled"}
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO_ROOT,
        env=env,
    )
    console = run.stdout + run.stderr
    assert run.returncode == 0, console[-4000:]
    assert run.stdout.strip().endswith("run finished")

    # Nothing of the engine's log reaches the console...
    assert not VLLM_LINE.search(console), [line for line in console.splitlines() if VLLM_LINE.search(line)]
    assert "safetensors" not in console
    # ... it is in the log folder, one file per worker process, from both ranks' engines.
    log_dir = tmp_path / "run" / LOG_DIR
    engine_logs = [p for p in log_dir.glob("worker-*.log") if VLLM_LINE.search(p.read_text())]
    assert len(engine_logs) == 2, sorted(p.name for p in log_dir.iterdir())
    for path in engine_logs:
        assert "Initializing a V1 LLM engine" in path.read_text()

    # Own warnings stay on the console: the workers' (forwarded by Ray) and the driver's; a library's
    # Python warning in the driver goes to driver.log.
    assert re.search(r"\(pid=\d+\).*own worker warning from rank 0", console)
    assert re.search(r"\(pid=\d+\).*own worker warning from rank 1", console)
    assert "UserWarning: own driver warning" in console
    assert "library driver warning" not in console
    assert f"{torch.__file__}:1: FutureWarning: library driver warning" in (log_dir / DRIVER_LOG).read_text()

    # The console keeps the metric line, with the start-up report on the first record (the step).
    step_line = next(line for line in console.splitlines() if "step 1/1 |" in line)
    assert "startup/ray_s" in step_line and "startup/total_s" in step_line
    [record] = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert record["step"] == 1 and "startup/engine_s" in record and "startup/validation_s" not in record
