"""Checks that need more than the config's own values and still run before Ray starts: every prompt
longer than ``data.max_prompt_length`` (it needs the tokenizer) and an output folder on a read-only
filesystem."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.data import write_rows
from tests.trainer.test_early_errors import REPO_ROOT, run_cli
from trainer.config import ConfigError, load_config
from trainer.config.prompt_lengths import check_prompts_fit, prompt_tokenizer


def row(content: str) -> dict:
    return {"data_source": "toy", "prompt": [{"role": "user", "content": content}], "reward_model": {"ground_truth": "2"}}


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    # The tiny model's character tokenizer: one token per character, no template around a user turn.
    return write_rows([row("12345+67890="), row("1+1=1+1="), row("123+456=")], tmp_path / "train.parquet")


def overrides(train_file: Path, tmp_path: Path, max_prompt_length: int) -> list[str]:
    return [
        f"data.train_files=[{train_file}]",
        "data.val_files=[]",
        "trainer.val_every=0",
        f"data.max_prompt_length={max_prompt_length}",
        f"trainer.output_dir={tmp_path / 'run'}",
    ]


def test_no_prompt_fitting_names_the_key_and_the_shortest_and_longest_length(tmp_path, train_file):
    config = load_config(None, overrides(train_file, tmp_path, 7))
    with pytest.raises(ConfigError) as info:
        check_prompts_fit(config, prompt_tokenizer(config))
    assert info.value.problems == (
        "data.max_prompt_length: 7 tokens is shorter than every prompt of data.train_files (3 prompts: the "
        "shortest has 8 tokens, the longest 12); raise it to at least 8",
    )


def test_one_fitting_prompt_is_enough(tmp_path, train_file):
    config = load_config(None, overrides(train_file, tmp_path, 8))
    check_prompts_fit(config, prompt_tokenizer(config))


def test_the_cli_stops_with_code_2_before_ray_starts(tmp_path, train_file):
    result = run_cli({"too_long": overrides(train_file, tmp_path, 7)})["too_long"]
    assert result["code"] == 2, result
    assert "data.max_prompt_length: 7 tokens is shorter than every prompt of data.train_files" in result["stderr"]
    assert result["ray"] is False and result["children"] == [], result


READ_ONLY_DRIVER = """
import sys
from trainer.config import ConfigError, load_config
try:
    load_config(None, sys.argv[1:])
except ConfigError as error:
    print(error)
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare to mount a read-only tmpfs")
def test_a_read_only_filesystem_is_reported_as_read_only(tmp_path, train_file):
    """A read-only tmpfs mounted in a private mount namespace (as root, or in a user namespace)."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    out = mount_point / "run"
    script = (
        f"mount -t tmpfs -o ro tmpfs {mount_point} && "
        f"{sys.executable} -c '{READ_ONLY_DRIVER}' data.train_files=[{train_file}] data.val_files=[] "
        f"trainer.val_every=0 trainer.output_dir={out}"
    )
    run = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if "mount" in run.stderr and run.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {run.stderr.strip()}")
    assert f"trainer.output_dir: {str(out)!r} cannot be written: {str(mount_point)!r} is on a read-only filesystem" in run.stdout, run


def test_a_nested_key_typo_in_a_yaml_file_names_the_file(tmp_path, train_file):
    """A misfit set by the file names the file; one set by an override (or overridden) does not."""
    config_file = tmp_path / "run.yaml"
    config_file.write_text("actor:\n  lrr: 1.0e-5\n  lr: fast\nrollout:\n  n: 4\n")
    with pytest.raises(ConfigError) as info:
        load_config(config_file, [*overrides(train_file, tmp_path, 8), "actor.lr=1e-4", "rollout.nn=3"])
    assert info.value.problems == (
        "rollout.nn: unknown key; did you mean 'rollout.n'?",
        f"actor.lrr: unknown key; did you mean 'actor.lr'? (set in {config_file})",
    )
