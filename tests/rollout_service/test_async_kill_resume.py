"""kill -9 of an asynchronous run while work is in flight on the rollout pool, then resume: no prompt lost,
none twice. Two modes, one module-scoped run each: one-step-off, and partial rollouts streamed on the pool.

The real command line (``python -m trainer.main``) runs GRPO on the tiny target-character task with
the HF engine on a rollout pool of its own (1 slot, the actor on another), ``async_rollout.max_staleness:
1``, a checkpoint after every step and ``trainer.rollout_dump`` on, which records the prompt index of
every row each step trained (``rollouts/step_<k>.jsonl``). 16 prompts in shuffled batches of 8: two
steps per epoch, so the resumed step 3 opens the second epoch.

By hand, one-step-off: step 2 admits step 3's batch to the pool before its update, then logs and writes
the checkpoint of step 2, whose data position counts two batches (step 3's is taken from the data only
through the look-ahead). The test watches for that checkpoint's marker file and SIGKILLs the driver and
every process under it (Ray's own processes and the workers) at once, with step 3's batch in flight.
The same command in the same folder resumes from step 2 and admits step 3's prompts again.

Partial rollouts streamed on the pool (``async_rollout.partial_round_tokens: 3``): step 2 submits the
first round of step 3's batch on version 1 and leaves it running during its update; the checkpoint of
step 2 settles that round (its tokens are saved, and step 3's batch counts as handed out: the data
position is three batches in, with its prompts held). The kill lands in step 3; the resumed step 3
continues those samples, so its rows' oldest tokens are of version 1, the round's, not 2.

Either way, over the surviving run each step's rows must be the prompts of the data order's batch of
that step, 8 rows each, so every id is trained exactly as often as in the uninterrupted run (twice in 4
steps): a resume that dropped the in-flight batch would skip step 3's prompts (and train step 4's
twice), one that counted it twice would train them twice.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections import Counter
from pathlib import Path

import psutil
import pytest
import yaml

from hybridflow.checkpoint import MARKER_FILE
from hybridflow.checkpoint.marker import read_marker
from hybridflow.data.sampler import ResumableBatchSampler
from hybridflow.metrics import read_jsonl
from hybridflow.metrics.rollout_dump import read_rollout_dump
from tests.trainer._command_line import run_to_the_end, start_driver, wait_for_file
from tests.trainer._runs import run_config, write_task
from trainer.config import config_to_dict

# Two runs of the command line, each mostly start-up (Ray, two pools, the reward pool).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * 600)]

STEPS = 4
KILLED_AFTER = 2
PROMPTS = 16
BATCH = 8
SAMPLES = 8
SETTINGS = [
    "actor.param_dtype=float32",
    "resource.slots_per_node=1",
    f"data.train_batch_size={BATCH}",
    f"rollout.n={SAMPLES}",
    "actor.ppo_mini_batch_size=64",
    "actor.ppo_micro_batch_size=32",
    "resource.pools={rollout_pool: {nodes: 1, slots_per_node: 1}}",
    "resource.placement={rollout: rollout_pool}",
    "async_rollout.max_staleness=1",
    "actor.rollout_correction=token",
    "trainer.save_every=1",
    "trainer.rollout_dump=true",
]
MODES = {"one_step_off": [], "partial_stream": ["async_rollout.partial_round_tokens=3"]}


def kill_tree(driver: subprocess.Popen) -> None:
    """SIGKILL the driver and every process under it at once, then wait until all are gone."""
    parent = psutil.Process(driver.pid)
    processes = [parent, *parent.children(recursive=True)]
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):  # ended on its own meanwhile
            process.send_signal(signal.SIGKILL)
    assert driver.wait(timeout=30) == -signal.SIGKILL
    _, alive = psutil.wait_procs(processes, timeout=30)
    assert not alive, f"still running after SIGKILL: {alive}"


def kill_when_in_flight(config: Path, output_dir: Path, log: Path) -> None:
    """Start the run and kill its process tree as soon as the step-`KILLED_AFTER` checkpoint is complete
    (its marker is written last), before step `KILLED_AFTER` + 1 ends."""
    marker = output_dir / "checkpoints" / f"step_{KILLED_AFTER}" / MARKER_FILE
    driver = start_driver(config, log)
    try:
        wait_for_file(driver, marker, log)
        kill_tree(driver)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


@pytest.fixture(scope="module", params=list(MODES))
def runs(request, tmp_path_factory):
    root = write_task(tmp_path_factory.mktemp(f"async_kill_{request.param}"), prompts=PROMPTS)
    output_dir = root / "run"
    config = run_config(root, "hf", STEPS, [*SETTINGS, *MODES[request.param], f"trainer.output_dir={output_dir}"])
    config_file = root / "run.yaml"
    config_file.write_text(yaml.safe_dump(config_to_dict(config)))

    kill_when_in_flight(config_file, output_dir, root / "killed.log")
    killed = {
        "records": read_jsonl(output_dir / "metrics.jsonl"),
        "dump": read_rollout_dump(output_dir / "rollouts"),
        "checkpoints": sorted(path.name for path in (output_dir / "checkpoints").iterdir()),
        "marker": read_marker(output_dir / "checkpoints" / f"step_{KILLED_AFTER}"),
    }
    output = run_to_the_end(config_file, root / "resumed.log")
    # The data order: the rows of each step of an uninterrupted run, as its loader's sampler draws them
    # (a dataset's ``index`` is its row's position), epoch after epoch.
    sampler = ResumableBatchSampler(PROMPTS, BATCH, seed=config.data.seed, shuffle=config.data.shuffle)
    order = [batch for _ in range(STEPS * BATCH // PROMPTS) for batch in sampler]
    return {
        "mode": request.param,
        "killed": killed,
        "output": output,
        "records": read_jsonl(output_dir / "metrics.jsonl"),
        "dump": read_rollout_dump(output_dir / "rollouts"),
        "order": order,
    }


def test_the_kill_lands_after_the_checkpoint_with_the_next_batch_in_flight(runs):
    killed = runs["killed"]
    assert [record["step"] for record in killed["records"]] == list(range(1, KILLED_AFTER + 1))
    assert sorted(killed["dump"]) == list(range(1, KILLED_AFTER + 1))
    assert killed["marker"].step == KILLED_AFTER
    loader_state = killed["marker"].state["loader"]
    if runs["mode"] == "one_step_off":
        # Step 2 left one batch admitted ahead of the trainer (step 3's), which its checkpoint does not
        # count: the data position is two batches in, the end of the first epoch.
        assert killed["records"][-1]["async/in_flight"] == 1
        assert (loader_state["epoch"], loader_state["position"]) == (0, PROMPTS // BATCH)
        assert "owed_indices" not in loader_state
    else:
        # Step 2 left step 3's batch started on the pool; the checkpoint settled that round: the batch
        # counts as handed out (one batch into the second epoch) and its prompts are held.
        assert killed["records"][-1]["partial/pending_prompts"] == BATCH
        assert (loader_state["epoch"], loader_state["position"]) == (1, 1)
        assert sorted(loader_state["owed_indices"]) == sorted(runs["order"][KILLED_AFTER])


def test_the_resumed_run_continues_from_the_checkpoint_and_logs_each_step_once(runs):
    assert f"at step {KILLED_AFTER}" in runs["output"]
    assert [record["step"] for record in runs["records"]] == list(range(1, STEPS + 1))
    assert sorted(runs["dump"]) == list(range(1, STEPS + 1))


def test_no_prompt_is_lost_or_trained_twice_across_the_kill(runs):
    order, dump = runs["order"], runs["dump"]
    # The data order crosses an epoch: each prompt twice in 4 steps (what the uninterrupted run trains).
    assert Counter(i for batch in order for i in batch) == Counter({i: STEPS * BATCH // PROMPTS for i in range(PROMPTS)})
    for step, batch in enumerate(order, start=1):
        rows = [row["index"] for row in dump[step]]
        assert rows == [i for i in batch for _ in range(SAMPLES)], step
    trained = Counter(row["index"] for step in dump for row in dump[step])
    assert trained == Counter({i: STEPS * BATCH * SAMPLES // PROMPTS for i in range(PROMPTS)})


def test_the_versions_trained_show_what_the_resume_kept(runs):
    staleness = [record["async/staleness_max"] for record in runs["records"]]
    if runs["mode"] == "one_step_off":
        # Versions of each step's rows: step 1 fresh (v0); step 2 admitted during step 1 (v0); the
        # resumed step 3 generated again on the weights of update 2 (v2); step 4 admitted during step 3 (v2).
        versions = [sorted({row["policy_version"] for row in runs["dump"][step]}) for step in range(1, STEPS + 1)]
        assert versions == [[0], [0], [2], [2]]
        assert staleness == [0, 1, 0, 1]
        return
    # Partial rollouts: the oldest token of each step's rows. Step 2 trains what step 1's overlapped round
    # started on v0; the resumed step 3 trains the settled round's tokens of v1 (kept across the kill);
    # step 4 what the resumed step 3 started on v2. No token is newer than the step's weights.
    ranges = [[row["token_versions"] for row in runs["dump"][step] if row["token_versions"]] for step in range(1, STEPS + 1)]
    oldest = [min(first for first, _ in step) for step in ranges]
    newest = [max(last for _, last in step) for step in ranges]
    assert oldest == [0, 0, 1, 2]
    assert all(new <= step - 1 for step, new in enumerate(newest, start=1))
    assert staleness == [0, 1, 1, 1]
