"""Run by `test_cli_fuzz` in a fresh process: generated bad configs and bad data files through the real
command line (`trainer.main.cli`), each checked for exit code 2, the config error alone on stderr, and
no Ray and no child process started.

``python -m tests.fuzz._cli_driver <folder> <examples>``; exits 0 when every case holds.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

import ray
from hypothesis import HealthCheck, assume, given, settings

from tests.fuzz._keys import override_list, valid_setup
from tests.fuzz.test_config_fuzz import fuzzed_keys, override_values
from tests.fuzz.test_data_fuzz import files, write
from trainer.config import ConfigError, load_config
from trainer.main import cli


def child_processes() -> list[str]:
    """Every thread's children: Ray's processes, a watchdog or reward workers would be listed."""
    children = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            children += Path(f"/proc/self/task/{task}/children").read_text().split()
    return children


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``hybridflow <argv>``: its exit code and what it wrote to stderr."""
    sys.argv = ["hybridflow", *argv]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            cli()
            code = 0
        except SystemExit as exit:
            code = exit.code
    return code, stderr.getvalue()


def check_rejected(argv: list[str]) -> None:
    """``argv`` is a bad config: the command exits with code 2 before starting anything."""
    try:
        load_config(None, argv)
    except ConfigError as error:
        expected = f"{error}\n"
    else:
        assume(False)  # a valid config would start a run
    code, stderr = run_cli(argv)
    assert code == 2, (argv, code, stderr)
    assert stderr == expected, (argv, stderr)
    assert stderr.splitlines()[0].endswith("in the run config:"), stderr
    assert not ray.is_initialized() and child_processes() == [], (argv, child_processes())


def main(folder: Path, examples: int) -> None:
    setup = valid_setup(folder / "setup")
    fuzz = settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )

    @fuzz
    @given(key=fuzzed_keys(), value=override_values())
    def bad_override(key: str, value: str) -> None:
        check_rejected([*override_list(setup), f"{key}={value}"])

    @fuzz
    @given(case=files())
    def bad_rows(case: tuple[list[dict], int, str]) -> None:
        rows, _, suffix = case
        path = write(rows, Path(tempfile.mkdtemp(dir=folder)), suffix)
        check_rejected([*override_list(setup), f"data.train_files=[{path}]"])

    bad_override()
    bad_rows()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
