"""Mistakes that used to surface after Ray and the workers had started are config errors now: named by
key, all at once, from the up-front validation, so the CLI exits with code 2 before any process starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.data import write_rows
from trainer.config import ConfigError, load_config

REPO_ROOT = Path(__file__).resolve().parents[2]
ROW = {"data_source": "toy", "prompt": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}
REWARD_FILE = "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"


def valid_setup(tmp_path: Path) -> dict[str, Path]:
    """Paths of a valid setup: data files with a row, a reward file, an output folder that can be made."""
    paths = {
        "train": write_rows([ROW], tmp_path / "train.parquet"),
        "val": write_rows([ROW], tmp_path / "val.jsonl"),
        "reward": tmp_path / "reward.py",
        "out": tmp_path / "run",
    }
    paths["reward"].write_text(REWARD_FILE)
    return paths


@pytest.fixture
def good(tmp_path: Path) -> dict[str, Path]:
    return valid_setup(tmp_path)


def overrides(good: dict[str, Path], **changes: str) -> list[str]:
    values = {
        "data.train_files": f"[{good['train']}]",
        "data.val_files": f"[{good['val']}]",
        "reward.default_fn": f"{good['reward']}:score",
        "trainer.output_dir": str(good["out"]),
        **{key.replace("__", "."): value for key, value in changes.items()},
    }
    return [f"{key}={value}" for key, value in values.items()]


def bad_cases(tmp_path: Path, good: dict[str, Path]) -> dict[str, tuple[list[str], Path | None, str]]:
    """Each case: overrides, a YAML file (or None) and the one problem expected."""
    existing_file = tmp_path / "run.txt"
    existing_file.write_text("not a folder")
    zero_bytes = tmp_path / "empty.parquet"
    zero_bytes.write_bytes(b"")
    no_rows = write_rows([], tmp_path / "no_rows.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    schema_only = tmp_path / "schema_only.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), schema_only)
    broken_yaml = tmp_path / "broken.yaml"
    broken_yaml.write_text("data:\n  max_prompt_length: 8\nactor:\n  lr: [1e-5\n  betas: [0.9, 0.99]\n")
    missing_fn = f"{good['reward']}:missing_name"
    defines = f"reward function file {str(good['reward'])!r} defines no 'missing_name'; it defines ['score']"
    return {
        "output_dir_is_a_file": (
            overrides(good, trainer__output_dir=str(existing_file)),
            None,
            f"trainer.output_dir: {str(existing_file)!r} is an existing file, not a folder",
        ),
        "zero_byte_parquet": (
            overrides(good, data__train_files=f"[{zero_bytes}]"),
            None,
            f"data.train_files[0]: file {str(zero_bytes)!r} is empty (0 bytes)",
        ),
        "parquet_without_rows": (
            overrides(good, data__train_files=f"[{good['train']},{schema_only}]"),
            None,
            f"data.train_files[1]: file {str(schema_only)!r} holds no rows",
        ),
        "empty_jsonl": (
            overrides(good, data__val_files=f"[{no_rows}]"),
            None,
            f"data.val_files[0]: file {str(no_rows)!r} is empty (0 bytes)",
        ),
        "blank_jsonl": (
            overrides(good, data__val_files=f"[{tmp_path / 'blank.jsonl'}]"),
            None,
            f"data.val_files[0]: file {str(tmp_path / 'blank.jsonl')!r} holds no rows",
        ),
        "yaml_syntax_error": (
            overrides(good),
            broken_yaml,
            f"{broken_yaml}:5:8: invalid YAML: did not find expected ',' or ']' "
            "(while parsing a flow sequence at line 4, column 7)",
        ),
        "default_fn_missing_name": (
            overrides(good, reward__default_fn=missing_fn),
            None,
            f"reward.default_fn: {defines}",
        ),
        "fn_by_source_missing_name": (
            [*overrides(good), f"reward.fn_by_source.gsm8k={missing_fn}"],
            None,
            f"reward.fn_by_source.gsm8k: {defines}",
        ),
        "default_fn_misspelled_registered_name": (
            overrides(good, reward__default_fn="exact_matc"),
            None,
            f"reward.default_fn: {unregistered('exact_matc', 'exact_match')}",
        ),
        "fn_by_source_misspelled_registered_name": (
            [*overrides(good), "reward.fn_by_source.gsm8k=math_verfy"],
            None,
            f"reward.fn_by_source.gsm8k: {unregistered('math_verfy', 'math_verify')}",
        ),
    }


def unregistered(name: str, close: str) -> str:
    registered = "code_execution, code_execution_all, exact_match, math_verify, think_answer_format"
    return (
        f"no reward function registered as {name!r}; did you mean {close!r}? registered: {registered} "
        "(or give 'file.py:function')"
    )


def test_the_good_setup_loads(good):
    config = load_config(None, overrides(good))
    assert config.reward.default_fn == f"{good['reward']}:score"


@pytest.mark.parametrize(
    "case",
    [
        "output_dir_is_a_file",
        "zero_byte_parquet",
        "parquet_without_rows",
        "empty_jsonl",
        "blank_jsonl",
        "yaml_syntax_error",
        "default_fn_missing_name",
        "fn_by_source_missing_name",
        "default_fn_misspelled_registered_name",
        "fn_by_source_misspelled_registered_name",
    ],
)
def test_a_late_error_is_now_a_config_problem_naming_its_key(tmp_path, good, case):
    items, yaml_file, expected = bad_cases(tmp_path, good)[case]
    with pytest.raises(ConfigError) as info:
        load_config(yaml_file, items)
    assert info.value.problems == (expected,)


def test_an_output_dir_under_a_file_is_reported_once(tmp_path, good):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(good, trainer__output_dir=str(blocker / "run")))
    # The checkpoint folder inside it is not reported again.
    assert info.value.problems == (
        f"trainer.output_dir: {str(blocker / 'run')!r} cannot be created: {str(blocker)!r} is a file",
    )


CLI_DRIVER = """
import contextlib, io, json, os, sys
import ray
from trainer.main import cli

results = {}
for name, argv in json.loads(sys.argv[1]).items():
    sys.argv = ["hybridflow", *argv]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            cli()
            code = 0
        except SystemExit as exit:
            code = exit.code
    # Every thread's children: Ray's processes, a watchdog, reward workers would all be listed here.
    children = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            children += open(f"/proc/self/task/{task}/children").read().split()
    results[name] = {"code": code, "stderr": stderr.getvalue(), "ray": ray.is_initialized(), "children": children}
print(json.dumps(results))
"""


def run_cli(argvs: dict[str, list[str]]) -> dict[str, dict]:
    """Each named argument list through the CLI in one fresh interpreter (`CLI_DRIVER`): its exit code,
    stderr, whether Ray started and the child processes left, by name."""
    run = subprocess.run(
        [sys.executable, "-c", CLI_DRIVER, json.dumps(argvs)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])



def test_the_cli_exits_with_code_2_before_starting_anything(tmp_path, good):
    """All the cases through the real command line in one fresh process: each exits with code 2, prints
    the header and its one problem, and neither Ray nor any child process was started."""
    cases = bad_cases(tmp_path, good)
    argvs = {
        name: [*(["--config", str(yaml_file)] if yaml_file else []), *items]
        for name, (items, yaml_file, _) in cases.items()
    }
    results = run_cli(argvs)
    for name, (_, _, expected) in cases.items():
        result = results[name]
        assert result["code"] == 2, (name, result)
        assert result["stderr"] == f"1 problem in the run config:\n  - {expected}\n", name
        assert result["ray"] is False and result["children"] == [], (name, result)
