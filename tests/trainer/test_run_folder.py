"""A run's output folder belongs to one run (`trainer.run_folder.open_run`), decided before Ray starts.

The probe that this answers: ``resume=disable`` in a folder of 6 logged steps rewound ``metrics.jsonl``
to the new run's steps, kept the old run's step_4 and step_6, and the next ``resume=auto`` resumed from
the old run's step_6. Here a fresh start in a used folder is refused (or archives, or deletes, as
asked), a checkpoint of another config is named with its differing keys, and an explicit torn resume
folder stops before anything starts. No Ray, except the two command-line cases, which check that Ray
was not started.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from hybridflow.checkpoint import MARKER_FILE, CheckpointStore, RunIdentity, flat_config, read_run_file
from tests.trainer.test_early_errors import overrides, run_cli, valid_setup
from trainer.config import config_to_dict, load_config
from trainer.run_folder import FREE_KEYS, RunFolderError, _new_folder, open_run


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    return valid_setup(tmp_path)


def _config(setup: dict[str, Path], **changes: str):
    return load_config(None, overrides(setup, **changes))


def _old_run(
    setup: dict[str, Path], steps: int = 6, saved: tuple[int, ...] = (4, 6), **changes: str
) -> RunIdentity:
    """The probe's earlier run in ``setup["out"]``: ``steps`` logged steps, checkpoints at ``saved``."""
    config = _config(setup, **changes)
    identity = RunIdentity.of("old-run", flat_config(config_to_dict(config)), FREE_KEYS)
    out = setup["out"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "score/mean": 0.1 * s}) + "\n" for s in range(1, steps + 1))
    )
    (out / "run.json").write_text(json.dumps(identity.to_dict()))
    store = CheckpointStore(out / "checkpoints")
    for step in saved:
        store.save(
            step,
            {"loader": {"position": step}},
            lambda folder: (folder / "actor.bin").write_bytes(b"w" * 64),
            run=identity,
        )
    return identity


def test_a_fresh_start_in_a_used_folder_is_refused_naming_the_folder_what_it_holds_and_the_ways_out(setup):
    _old_run(setup)
    before = sorted(str(p.relative_to(setup["out"])) for p in setup["out"].rglob("*"))
    with pytest.raises(RunFolderError) as info:
        open_run(_config(setup, trainer__resume="disable"))
    message = str(info.value)
    assert message.startswith("1 problem in the run config:\n  - trainer.output_dir: ")
    assert f"{setup['out']} already holds another run's outputs" in message
    assert f"2 checkpoints in {setup['out'] / 'checkpoints'} (last step 6)" in message
    assert "metrics.jsonl with 6 logged steps (last step 6)" in message
    assert (
        f"2 checkpoints in {setup['out'] / 'checkpoints'} (last step 6), metrics.jsonl with 6 logged steps "
        "(last step 6), run.json, written by run old-run. A fresh start (trainer.resume=disable) would mix"
    ) in message
    assert "Use a new trainer.output_dir" in message
    assert "trainer.existing_output=archive" in message and "trainer.existing_output=delete" in message
    # Nothing was touched.
    assert sorted(str(p.relative_to(setup["out"])) for p in setup["out"].rglob("*")) == before


def test_auto_without_a_complete_checkpoint_is_a_fresh_start_and_refused_too(setup):
    _old_run(setup, steps=3, saved=(2,))
    (setup["out"] / "checkpoints" / "step_2" / MARKER_FILE).unlink()
    with pytest.raises(
        RunFolderError, match=r"1 checkpoint in .* \(last step 2\).*trainer.resume=auto found no complete"
    ):
        open_run(_config(setup))


def test_an_unused_folder_starts_fresh_with_a_new_run_id(setup):
    (setup["out"]).mkdir()
    (setup["out"] / "metrics.jsonl").write_text("")
    start = open_run(_config(setup, trainer__resume="disable"))
    assert start.checkpoint is None
    recorded = read_run_file(setup["out"])
    assert recorded is not None and recorded.run_id == start.identity.run_id != "old-run"
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}", start.identity.run_id)


def test_archive_moves_the_old_run_into_a_dated_subfolder_and_says_where(setup, caplog):
    _old_run(setup)
    old_metrics = (setup["out"] / "metrics.jsonl").read_text()
    with caplog.at_level(logging.WARNING):
        start = open_run(_config(setup, trainer__resume="disable", trainer__existing_output="archive"))
    (archive,) = (setup["out"] / "archive").iterdir()
    assert re.fullmatch(r"\d{8}-\d{6}", archive.name)
    assert (archive / "metrics.jsonl").read_text() == old_metrics
    assert sorted(p.name for p in (archive / "checkpoints").iterdir()) == ["step_4", "step_6"]
    assert CheckpointStore(archive / "checkpoints").latest().run.run_id == "old-run"
    assert not (setup["out"] / "metrics.jsonl").exists()
    assert CheckpointStore(setup["out"] / "checkpoints").steps() == []
    assert "moved 2 checkpoints" in caplog.text and f"into {archive}" in caplog.text
    assert (
        start.checkpoint is None and read_run_file(setup["out"]).run_id == start.identity.run_id != "old-run"
    )


def test_two_archives_in_one_second_get_folders_of_their_own(tmp_path):
    assert [_new_folder(tmp_path / "archive", "20261202-010000").name for _ in range(3)] == [
        "20261202-010000",
        "20261202-010000-2",
        "20261202-010000-3",
    ]


def test_delete_removes_the_old_run_and_says_what_it_deleted(setup, caplog):
    _old_run(setup)
    with caplog.at_level(logging.WARNING):
        start = open_run(_config(setup, trainer__resume="disable", trainer__existing_output="delete"))
    assert not (setup["out"] / "metrics.jsonl").exists()
    assert CheckpointStore(setup["out"] / "checkpoints").steps() == []
    assert not (setup["out"] / "archive").exists()
    assert "deleted 2 checkpoints" in caplog.text and "metrics.jsonl with 6 logged steps" in caplog.text
    assert str(setup["out"] / "checkpoints" / "step_6") in caplog.text
    assert start.checkpoint is None


def test_auto_resumes_its_own_run_silently_and_keeps_the_run_id(setup, caplog):
    _old_run(setup)
    with caplog.at_level(logging.WARNING, logger="trainer.run_folder"):
        start = open_run(_config(setup, trainer__total_steps="12"))  # the run's length may change
    assert start.checkpoint.step == 6
    assert start.identity.run_id == "old-run"
    assert caplog.text == ""


def test_auto_names_the_keys_in_which_another_runs_checkpoint_differs(setup, caplog):
    _old_run(setup, algorithm__norm_by_std="false", rollout__n="4")
    with caplog.at_level(logging.WARNING, logger="trainer.run_folder"):
        start = open_run(_config(setup))
    assert start.checkpoint.step == 6
    assert "of run old-run, whose config differs from this one" in caplog.text
    assert (
        "in 2 key(s): algorithm.norm_by_std false -> true, rollout.n 4 -> 8; the run goes on with this config"
    ) in caplog.text
    assert start.identity.run_id == "old-run"


def test_a_checkpoint_of_another_prompt_order_is_refused_before_ray(setup):
    """The data position of a checkpoint means nothing under another data.seed: before, the resume
    failed after Ray and the workers had started, in the sampler, with a traceback."""
    _old_run(setup, data__seed="1")
    with pytest.raises(RunFolderError) as info:
        open_run(_config(setup, trainer__total_steps="12"))
    assert str(info.value) == (
        "1 problem in the run config:\n  - trainer.resume: checkpoint "
        f"{setup['out'] / 'checkpoints' / 'step_6'} was written with other data settings (data.seed 1 -> 0): "
        "its data position holds only for its own prompt order and batch size. Resume with the "
        "checkpoint's values, or start fresh in a new trainer.output_dir"
    )


def test_a_changed_learning_rate_is_named_and_the_config_wins(setup, caplog):
    _old_run(setup, actor__lr="1e-5")
    with caplog.at_level(logging.WARNING, logger="trainer.run_folder"):
        open_run(_config(setup, actor__lr="1e-4"))
    assert "the optimizer settings differ from the checkpoint's: actor.lr 1e-05 -> 0.0001" in caplog.text
    assert "The config wins" in caplog.text


def test_auto_says_so_when_the_folders_metrics_belong_to_another_run(setup, caplog):
    _old_run(setup)
    (setup["out"] / "run.json").write_text(json.dumps(RunIdentity("other-run", "0", {}).to_dict()))
    with caplog.at_level(logging.WARNING, logger="trainer.run_folder"):
        open_run(_config(setup))
    assert "come from two runs" in caplog.text and "other-run" in caplog.text


def test_an_explicit_torn_resume_folder_is_refused_with_its_reason(setup):
    _old_run(setup)
    torn = setup["out"] / "checkpoints" / "step_6"
    marker = torn / MARKER_FILE
    marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])
    with pytest.raises(RunFolderError) as info:
        open_run(_config(setup, trainer__resume=str(torn)))
    assert f"trainer.resume: checkpoint {torn} is incomplete: {MARKER_FILE} cannot be read" in str(info.value)


def test_the_cli_refuses_both_with_code_2_before_ray_starts(setup):
    """Through the command line: the refusals exit with code 2 and neither Ray nor any process started
    (before, the torn folder was refused only once the workers had started, 35 s in)."""
    _old_run(setup)
    torn = setup["out"] / "checkpoints" / "step_4"
    (torn / "actor.bin").write_bytes(b"w" * 63)
    results = run_cli(
        {
            "used_folder": overrides(setup, trainer__resume="disable"),
            "torn_resume": overrides(setup, trainer__resume=str(torn)),
        }
    )
    for name, result in results.items():
        assert result["code"] == 2, (name, result)
        assert result["ray"] is False and result["children"] == [], (name, result)
    assert (
        f"trainer.output_dir: {setup['out']} already holds another run's outputs"
        in results["used_folder"]["stderr"]
    )
    assert (
        f"trainer.resume: checkpoint {torn} is incomplete: actor.bin has 63 bytes, 64 were written"
        in (results["torn_resume"]["stderr"])
    )
