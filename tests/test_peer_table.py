"""benchmarks/peer_table.py without a GPU: the row order, the ratios of a row, and ``--smoke`` end to
end (tiny layers under the interpreter: every column checked against the float64 reference, rows
written as they finish, the markdown table and its summary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchload import load_benchmark

FAKE = Path(__file__).parent / "data" / "fake_peer.py"


@pytest.fixture(scope="module")
def pt():
    return load_benchmark("peer_table")


def test_decode_rows_run_first_then_prefill_preset_by_preset(pt):
    specs = pt.plan_rows(["a", "b"], [16384, 1, 512, 8, 64])
    assert specs[:6] == [("a", 1, "uniform"), ("b", 1, "uniform"), ("a", 8, "uniform"), ("a", 8, "concentrated"),
                         ("b", 8, "uniform"), ("b", 8, "concentrated")]
    assert specs[6:10] == [("a", 64, "uniform"), ("a", 64, "concentrated"), ("b", 64, "uniform"),
                           ("b", 64, "concentrated")]
    assert specs[10:] == [("a", 512, "uniform"), ("a", 16384, "uniform"), ("b", 512, "uniform"),
                          ("b", 16384, "uniform")]


def test_a_rows_ratios_take_the_best_of_each_side(pt):
    """best megamoe = the faster routed-experts backend; best peer = as shipped or its best Hopper
    config (the in-graph peer only where the file has no hooks); a wrong column fails the row."""
    row = pt.derive({"preset": "p", "T": 8, "routing": "uniform", "floor_us": 50.0, "auto": "multi",
                     "multi_us": 120.0, "multi_ok": True, "multi_err_max": 0.01, "megakernel_us": 100.0,
                     "megakernel_ok": True, "megakernel_err_max": 0.002, "layer_us": 130.0, "predicted_us": 117.0,
                     "peer_us": 150.0, "peer_inline_us": 90.0, "peer_configs": {
                         "H200[8]": {"us": 135.0, "ok": True, "err_max": 0.003},
                         "H20[8]": {"ok": False, "err_max": 0.5, "error": "wrong output"}}})
    assert row["best_backend"] == "megakernel" and row["best_us"] == 100.0 and row["auto_us"] == 120.0
    assert row["peer_hopper_label"] == "H200[8]" and row["peer_best_us"] == 135.0
    assert row["peer_over_best"] == pytest.approx(1.35) and row["best_over_floor"] == pytest.approx(2.0)
    assert row["predicted_over_layer"] == pytest.approx(0.9) and row["err_max"] == 0.5
    assert not row["all_ok"] and row["failed"] == ["peer H20[8]"]
    bare = pt.derive({"preset": "p", "T": 1, "routing": "uniform", "floor_us": 10.0, "auto": "multi",
                      "multi_us": 40.0, "peer_inline_us": 30.0, "peer_inline_ok": True})
    assert bare["peer_best_us"] == 30.0 and bare["all_ok"] and "megakernel_us" not in bare


def test_smoke_runs_every_column_and_writes_rows(pt, tmp_path, capsys):
    """DeepSeek-V3's grouped router (tiny): uniform and concentrated rows at T = 8, each column within
    float32 tolerance of the reference, the concentrated row on exactly K experts."""
    assert pt.main(["--smoke", "--peer", str(FAKE), "--out", str(tmp_path), "--presets", "deepseek-v3",
                    "--tokens", "8"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "peer.jsonl").read_text().splitlines()]
    assert [(r["preset"], r["T"], r["routing"]) for r in rows] == [("deepseek-v3", 8, "uniform"),
                                                                  ("deepseek-v3", 8, "concentrated")]
    cfg = pt.layer_config("deepseek-v3", True)
    for r in rows:
        assert r["all_ok"], r["failed"]
        for col in ("multi", "megakernel", "layer", "peer", "peer_inline"):
            assert r[f"{col}_ok"] and r[f"{col}_err_max"] < 1e-4 and r[f"{col}_us"] > 0, col
        assert set(r["peer_configs"]) == {"fake-a", "fake-b"} and r["peer_hopper_label"] in r["peer_configs"]
        assert r["peer_shipped"] == [{"chunk": 1}, "fake default"]
        assert r["predicted_us"] > 0 and r["profile"] == "h200"
        assert r["gpu"] == "cpu-interpreter" and r["commit"] and r["date"] and r["torch"] and r["triton"]
        assert r["best_us"] == min(r["multi_us"], r["megakernel_us"])
    assert rows[1]["experts_touched"] == cfg.top_k
    md = (tmp_path / "peer_table.md").read_text()
    assert md.count("| deepseek-v3 | 8 |") == 2 and "Geomean best peer / best megamoe" in md
    assert "[2/2] deepseek-v3 T=8 concentrated" in capsys.readouterr().out


def test_the_budget_stops_rows_from_starting(pt, tmp_path, capsys):
    assert pt.main(["--smoke", "--peer", str(FAKE), "--out", str(tmp_path), "--presets", "mixtral-8x7b",
                    "--tokens", "1", "--budget-s", "0"]) == 0
    assert not (tmp_path / "peer.jsonl").exists()
    assert "budget spent (0 s): skipping mixtral-8x7b T=1 uniform" in capsys.readouterr().out


def test_a_bad_peer_is_refused(pt, tmp_path, capsys):
    p = tmp_path / "p.py"
    p.write_text("def fused_experts(x):\n    return x\n")
    assert pt.main(["--smoke", "--peer", str(p), "--out", str(tmp_path)]) == 2
    assert "cannot be called with the 5 arguments" in capsys.readouterr().err


def test_warm_runs_each_preset_and_T_once_in_processes_of_their_own(tmp_path, monkeypatch):
    """The compile-ahead's pool path (spawned processes, one per (preset, T)), on the CPU: every job
    ends without an error."""
    import importlib

    from benchload import BENCH

    monkeypatch.syspath_prepend(str(BENCH))
    pt = importlib.import_module("peer_table")  # by name: the spawned processes import it so
    logs = []
    pt.warm([("mixtral-8x7b", 1, "uniform"), ("mixtral-8x7b", 8, "uniform"), ("mixtral-8x7b", 8, "concentrated")],
            str(FAKE), 300, log=logs.append, smoke=True, processes=2)
    assert sorted(m.split(" (")[0] for m in logs) == ["# warmed mixtral-8x7b T=1", "# warmed mixtral-8x7b T=8"], logs


def test_a_peer_hook_that_raises_fails_its_column_only(pt, tmp_path):
    p = tmp_path / "hooked.py"
    p.write_text(FAKE.read_text() + "\n\ndef other_configs(T, E, I, H, K):\n    raise KeyError('no config file')\n")
    assert pt.main(["--smoke", "--peer", str(p), "--out", str(tmp_path), "--presets", "mixtral-8x7b",
                    "--tokens", "1"]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "peer.jsonl").read_text().splitlines()]
    assert row["peer_error"].startswith("RuntimeError: peer hook raised KeyError: 'no config file'")
    assert row["multi_ok"] and row["layer_ok"] and row["peer_inline_ok"] and "peer_us" not in row
    assert not row["all_ok"] and row["failed"] == ["peer"] and row["peer_best_us"] == row["peer_inline_us"]
