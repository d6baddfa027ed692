"""megamoe sweep: grids, bad axis values, and a small end-to-end run writing CSV and a plot."""

from __future__ import annotations

import pytest

from megamoe.cli import main
from megamoe.sweep import SweepError, grid, parse_axis


def test_grid_is_the_product_in_order():
    pts = grid({"routing": ["uniform", "skewed"], "tokens-per-gpu": [8, 16]})
    assert pts == [
        {"routing": "uniform", "tokens-per-gpu": 8}, {"routing": "uniform", "tokens-per-gpu": 16},
        {"routing": "skewed", "tokens-per-gpu": 8}, {"routing": "skewed", "tokens-per-gpu": 16},
    ]


@pytest.mark.parametrize("flag,text,message", [
    ("tokens-per-gpu", "128,abc", "--tokens-per-gpu: 'abc' is not a valid int"),
    ("routing", "uniform,,skewed", "--routing: empty item"),
])
def test_bad_axis_is_named(flag, text, message):
    with pytest.raises(SweepError, match=message):
        parse_axis(flag, text)


def test_small_sweep_writes_csv_and_plot(tmp_path, capsys):
    out = tmp_path / "sw"
    rc = main(["sweep", "--model", "qwen3-30b-a3b", "--system", "hgx-h200", "--tokens-per-gpu", "16,64",
               "--routing", "uniform", "--placement", "contiguous", "--schedule", "bulk,fused", "--jobs", "1",
               "--out", str(out)])
    assert rc == 0
    import pandas as pd

    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 4 and (df["layer_time_us"] >= df["analytic_us"] * (1 - 1e-9)).all()
    assert (out / "sweep.png").stat().st_size > 1000


def test_unknown_routing_is_an_error(tmp_path, capsys):
    rc = main(["sweep", "--routing", "sideways", "--tokens-per-gpu", "8", "--placement", "contiguous",
               "--schedule", "fused", "--system", "hgx-h200", "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 2
    assert "sideways" in capsys.readouterr().err
