"""The plot command turns a metrics file into PNG curves."""

from __future__ import annotations

import pytest

from hybridflow.metrics import JsonlLogger
from hybridflow.metrics.loggers.jsonl import read_jsonl
from hybridflow.metrics.plot import main, series, x_values

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run_file(tmp_path, monkeypatch):
    # matplotlib keeps its font cache under the home directory unless told otherwise; leave no trace.
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    pytest.importorskip("matplotlib")
    path = tmp_path / "metrics.jsonl"
    with JsonlLogger(path) as logger:
        for step in range(1, 6):
            logger.log({"score/mean": step / 10, "timing_s/step": 1.0 + step}, step)
    return path


def test_plot_writes_one_png_per_key(run_file, tmp_path):
    paths = main([str(run_file), "--out", str(tmp_path / "plots"), "--keys", "score/mean"])
    assert [p.name for p in paths] == ["score__mean.png"]
    assert paths[0].read_bytes().startswith(PNG_SIGNATURE)


def test_plot_all_keys_or_a_grid(run_file, tmp_path):
    paths = main([str(run_file), "--out", str(tmp_path / "all")])
    assert sorted(p.name for p in paths) == ["score__mean.png", "timing_s__step.png"]
    (grid,) = main([str(run_file), "--out", str(tmp_path / "grid"), "--grid"])
    assert grid.name == "metrics.png"
    assert grid.read_bytes().startswith(PNG_SIGNATURE)


def test_plot_names_an_unknown_key(run_file, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(run_file), "--out", str(tmp_path), "--keys", "nope"])
    assert "has no values for ['nope']" in capsys.readouterr().err


def test_time_axis_is_the_running_sum_of_step_seconds(run_file, tmp_path):
    # As a run logs it: validation alone at step 0 (no step time, so at 0 s), then steps 1..5 taking
    # 2, 3, 4, 5, 6 s, the last with its validation in the same record.
    path = tmp_path / "validated.jsonl"
    with JsonlLogger(path) as logger:
        logger.log({"val/accuracy": 0.25}, 0)
        for step in range(1, 6):
            validation = {"val/accuracy": 0.75} if step == 5 else {}
            logger.log({"score/mean": step / 10, "timing_s/step": 1.0 + step, **validation}, step)
    records = read_jsonl(path)
    assert x_values(records, "step") == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert x_values(records, "time") == [0.0, 2.0, 5.0, 9.0, 14.0, 20.0]
    assert series(records, "val/accuracy", "time") == ([0.0, 20.0], [0.25, 0.75])
    assert series(records, "score/mean", "step") == ([1.0, 2.0, 3.0, 4.0, 5.0], [0.1, 0.2, 0.3, 0.4, 0.5])
    paths = main([str(path), "--out", str(tmp_path / "t"), "--keys", "val/accuracy", "--x", "time"])
    assert [p.name for p in paths] == ["val__accuracy__time.png"]
    assert paths[0].read_bytes().startswith(PNG_SIGNATURE)
    (grid,) = main([str(path), "--out", str(tmp_path / "g"), "--grid", "--x", "time"])
    assert grid.name == "metrics__time.png"


def test_unknown_x_axis_is_refused(run_file):
    with pytest.raises(ValueError, match="x must be one of \\['step', 'time'\\], got 'epoch'"):
        x_values(read_jsonl(run_file), "epoch")
