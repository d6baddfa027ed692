"""benchmarks/bench_ep.py without GPUs: its arguments, its cases and its prediction rows."""

from __future__ import annotations

import json

import pytest
from benchload import BENCH, load_benchmark


def _bench_ep():
    return load_benchmark("bench_ep")


def test_dry_run_lists_every_case(capsys, tmp_path):
    """ranks x tokens x routing x placement cases, nothing run, nothing written."""
    out = tmp_path / "ep.jsonl"
    rc = _bench_ep().main(["--dry-run", "--ranks", "2,4", "--tokens", "64,512", "--routing", "uniform,skewed",
                           "--placement", "contiguous,eplb", "--nccl-channels", "4,16", "--out", str(out)])
    assert rc == 0 and not out.exists()
    rows = [json.loads(s) for s in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 * 2 * 2 * 2
    assert {(r["ranks"], r["tokens_per_rank"], r["routing"], r["placement"]) for r in rows} >= {(4, 512, "skewed", "eplb")}


@pytest.mark.parametrize("argv", [["--ranks", "0"], ["--tokens", "a,b"], ["--routing", "bogus"],
                                  ["--placement", "everywhere"], ["--transport", "nvshmem"], ["--copy-programs", "0"]],
                         ids=["zero-ranks", "tokens", "routing", "placement", "transport", "copy-programs"])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        _bench_ep().main(["--dry-run", *argv])
    assert e.value.code == 2


def test_prediction_rows_before_any_gpu(tmp_path):
    """The hgx-h200 predictions for a small case, bulk-synchronous then the fused launch's, and the EP
    schedule's traffic equals the simulator's."""
    out = tmp_path / "pred.jsonl"
    rc = _bench_ep().main(["--predict-only", "--ranks", "2", "--tokens", "64", "--routing", "skewed",
                           "--placement", "eplb", "--out", str(out)])
    assert rc == 0
    row, fused = [json.loads(s) for s in out.read_text().splitlines()]
    assert row["kind"] == "prediction" and row["system"] == "hgx-h200" and row["ranks"] == 2
    assert row["schedule_matches_simulator"] is True
    assert row["predicted_layer_us"] > 0 and row["predicted_dispatch_us"] > 0
    assert fused["schedule"] == "fused_ep" and fused["system"] == "hgx-h200" and fused["ranks"] == 2
    assert fused["predicted_layer_us"] > 0 and fused["bulk"]["predicted_layer_us"] == row["predicted_layer_us"]


def test_cpu_smoke_runs_the_measuring_code(tmp_path, monkeypatch):
    """The GPU path's worker on 2 gloo processes, a shrunk layer: rows come out, deterministic and consistent.

    Imported by name (not from a file spec) so that the spawned ranks can unpickle its worker."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_ep

    out = tmp_path / "smoke.jsonl"
    rc = bench_ep.main(["--cpu-smoke", "--ranks", "2", "--tokens", "16", "--routing", "skewed", "--placement", "eplb",
                        "--reps", "2", "--timeout-s", "600", "--out", str(out)])
    assert rc == 0
    pred, meas = [json.loads(s) for s in out.read_text().splitlines()]
    assert pred["kind"] == "prediction" and meas["kind"] == "measured"
    assert meas["bitwise_deterministic"] is True and meas["schedule_matches_simulator"] is True
    assert meas["backend"] == "gloo" and meas["layer_us"] > 0 and meas["prediction"]["predicted_layer_us"] > 0
    assert sum(map(sum, meas["traffic_rows"])) > 0


@pytest.mark.interpret
def test_cpu_smoke_runs_the_symmetric_transport(tmp_path, monkeypatch):
    """One rank (its symmetric buffers emulated, the copy, flag and fused kernels interpreted): a row per
    one-sided transport and program count, the phased one-sided layer bitwise the all-to-all one, the fused
    layer deterministic with its own prediction row written first (on the CPU the all-to-all path runs torch
    GEMMs, so the fused y is compared with it on a GPU only); two ranks skip them (no symmetric memory
    between CPU processes)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_ep

    out = tmp_path / "smoke.jsonl"
    rc = bench_ep.main(["--cpu-smoke", "--ranks", "1", "--tokens", "8", "--routing", "skewed", "--placement",
                        "contiguous", "--reps", "1", "--copy-programs", "1,3", "--timeout-s", "600", "--out", str(out)])
    assert rc == 0
    pred, pred_fused, a2a, *one_sided = [json.loads(s) for s in out.read_text().splitlines()]
    assert pred["kind"] == "prediction" and a2a["transport"] == "all_to_all"
    assert pred_fused["kind"] == "prediction" and pred_fused["schedule"] == "fused_ep"
    assert pred_fused["predicted_layer_us"] > 0
    sym = [r for r in one_sided if r["transport"] == "symmetric"]
    fused = [r for r in one_sided if r["transport"] == "fused"]
    assert len(sym) + len(fused) == len(one_sided)
    assert [r["copy_programs"] for r in sym] == [1, 3] and [r["copy_programs"] for r in fused] == [1, 3]
    for r in sym:
        assert r["bitwise_equal_all_to_all"] is True and r["bitwise_deterministic"] is True
        assert r["dispatch_us"] > 0 and r["combine_us"] > 0 and r["layer_us"] > 0 and r["symmetric_max_tokens"] == 8
    for r in fused:
        assert r["bitwise_deterministic"] is True and r["layer_us"] > 0
        assert r["dispatch_us"] is None and r["combine_us"] is None
        assert r["prediction_fused"]["predicted_layer_us"] == pred_fused["predicted_layer_us"]
        assert r["layer_ratio_fused"] == pytest.approx(r["layer_us"] / pred_fused["predicted_layer_us"])
