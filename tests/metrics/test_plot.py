"""The plot command turns a metrics file into PNG curves."""

from __future__ import annotations

import pytest

from hybridflow.metrics import JsonlLogger
from hybridflow.metrics.plot import main

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
