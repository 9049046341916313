"""Generated bad configs and bad data rows through the real command line, in a fresh process: each
exits with code 2, prints the config error (the header line, then one line per problem naming its key,
or its file, row and field) and nothing else on stderr, and starts neither Ray nor any child process.
The cases come from the same strategies as `test_config_fuzz` and `test_data_fuzz`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = 15


def test_bad_configs_and_rows_exit_with_code_2_before_starting_anything(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz._cli_driver", str(tmp_path), str(EXAMPLES)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
