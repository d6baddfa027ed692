"""benchmarks/fp8_table.py on small synthetic rows: issue 12's targets met and unmet, the faster bf16 path as
the baseline, FP8 rows paired with their run's bf16 rows, failed numerics, unpaired rows skipped."""

from __future__ import annotations

import json

import pytest
from benchload import load_benchmark

ft = load_benchmark("fp8_table")

PROV = {"gpu": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "commit": "abc1234", "date": "2026-12-03T06:00:00"}


def _write(tmp_path, name, rows):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def _decode(T, routing, mk, multi, bf16_mk, variants=(), mode="weights+act", **extra):
    """A bench_megakernel.py --fp8 row."""
    return {"preset": "qwen3-30b-a3b", "T": T, "routing": routing, "fp8": mode, "floor_us": 8.0,
            "megakernel_us": mk, "megakernel_ok": True, "megakernel_err_max": 2.6e-3,
            "multi_us": multi, "multi_ok": True, "multi_err_max": 2.6e-3, "bf16_megakernel_us": bf16_mk,
            "variants": list(variants), **PROV, **extra}


def _bench(T, dtype, us, preset="deepseek-v3", backend="multi", **extra):
    """A megamoe bench row (no routing, no check)."""
    return {"preset": preset, "T": T, "dtype": dtype, "ours_us": us, "backend": backend,
            "config": {"gemm1": {"variant": "tma_persistent"}}, **PROV, **extra}


def _line(lines, T, backend, routing="uniform"):
    (ln,) = [ln for ln in lines if ln["T"] == T and ln["backend"] == backend and ln["routing"] == routing]
    return ln


def test_decode_targets_met_unmet_and_failed_numerics(tmp_path):
    rows = [_decode(1, "uniform", 16.0, 40.0, 32.0),  # 2.0x: met
            _decode(8, "uniform", 100.0, 120.0, 150.0,  # 1.5x: not met; the variant is fast but fails
                    variants=[{"name": "fp8swap", "us": 50.0, "ok": False, "err_max": 1.0e-2},
                              {"name": "fp8xq", "error": "CompilationError: out of resources"}])]
    lines, skipped = ft.load_lines([_write(tmp_path, "mk.jsonl", rows)])
    assert not skipped
    t1 = _line(lines, 1, "megakernel")
    assert ft.speedup(t1) == pytest.approx(2.0) and ft.target(t1) == (">= 1.8x bf16", True, "")
    assert ft.target(_line(lines, 1, "multi-launch"))[1] is False  # 0.8x
    t8 = _line(lines, 8, "megakernel")
    assert ft.speedup(t8) == pytest.approx(1.5) and ft.target(t8) == (">= 1.8x bf16", False, "speed")
    swap = _line(lines, 8, "megakernel: fp8swap")
    assert ft.speedup(swap) == pytest.approx(3.0) and ft.target(swap) == (">= 1.8x bf16", False, "numerics")
    assert ft.target(_line(lines, 8, "megakernel: fp8xq")) is None  # failed: no time, held to nothing
    text = ft.table(lines, skipped)
    row_swap = next(s for s in text.splitlines() if "fp8swap" in s)
    assert "| FAILED |" in row_swap and "no (numerics)" in row_swap and "3.00x" in row_swap
    assert "failed: CompilationError" in next(s for s in text.splitlines() if "fp8xq" in s)
    # T = 1: megakernel met; multi-launch not; T = 8: megakernel, multi-launch (1.25x), fp8swap not
    assert "Targets met: 1 of 5 lines; 1 of 2 cases" in text
    assert "Skipped: 0 rows." in text and "commit abc1234, 2026-12-03" in text


def test_no_target_between_decode_and_prefill(tmp_path):
    lines, _ = ft.load_lines([_write(tmp_path, "mk.jsonl", [_decode(64, "uniform", 10.0, 10.0, 100.0)])])
    assert ft.target(_line(lines, 64, "megakernel")) is None
    assert "Targets met: 0 of 0 lines" in ft.table(lines, [])


def test_prefill_rows_paired_with_their_runs_bf16_rows_across_files(tmp_path):
    base = _write(tmp_path, "base.jsonl", [_bench(4096, "bf16", 8500.0), _bench(16384, "bf16", 24000.0)])
    # the FP8 rows of a second process: no bf16_us; T = 16384's run is another commit: cannot be paired
    fp8a = _write(tmp_path, "fp8a.jsonl", [_bench(4096, "fp8-act", 5000.0),
                                          _bench(16384, "fp8-act", 12000.0, commit="fff0000")])
    lines, skipped = ft.load_lines([base, fp8a])
    (ln,) = lines
    assert (ln["T"], ln["mode"], ln["paired"], ln["bf16"]) == (4096, "weights+act", True, {"multi": 8500.0})
    assert ft.speedup(ln) == pytest.approx(1.7) and ft.target(ln) == (">= 1.6x bf16", True, "")
    assert len(skipped) == 1 and "T=16384" in skipped[0] and "no bf16 time" in skipped[0]
    text = ft.table(lines, skipped)
    assert "8,500.0 †" in text and "multi-launch [tma_persistent]" in text
    assert "Targets met: 1 of 1 lines" in text and "Skipped: 1 rows: deepseek-v3 T=16384" in text


def test_a_row_that_carries_its_bf16_time_is_not_paired(tmp_path):
    rows = [_bench(4096, "bf16", 900.0), _bench(4096, "fp8", 1000.0, bf16_us=800.0, bf16_backend="multi")]
    (ln,), _ = ft.load_lines([_write(tmp_path, "b.jsonl", rows)])
    assert not ln["paired"] and ft.speedup(ln) == pytest.approx(0.8)


def test_the_faster_bf16_path_is_the_baseline(tmp_path):
    """bf16 megakernel 30 and multi-launch 40 (a bench_megakernel.py bf16 row of the run), FP8 20: 1.5x the
    faster path (unmet), though 2.0x the slower."""
    bf16 = {"preset": "qwen3-30b-a3b", "T": 8, "routing": "uniform", "fp8": None, "megakernel_us": 30.0,
            "multi_us": 40.0, **PROV}
    fp8 = _bench(8, "fp8", 20.0, preset="qwen3-30b-a3b")
    (ln,), _ = ft.load_lines([_write(tmp_path, "r.jsonl", [bf16, fp8])])
    assert ft.bf16_path(ln) == (30.0, "megakernel") and ft.speedup(ln) == pytest.approx(1.5)
    assert ft.target(ln) == (">= 1.8x bf16", False, "speed")


def test_prefill_candidates_and_last_file_wins(tmp_path):
    row = {"preset": "qwen3-30b-a3b", "T": 4096, "limit_max": 0.015, **PROV, "candidates": {
        "bf16": {"us": 750.0}, "fp8w_tma": {"us": 1250.0, "ok": True, "err_max": 4.2e-3},
        "fp8a_m128": {"error": "OutOfResources"}}}
    old = _write(tmp_path, "old.jsonl", [row])
    new = _write(tmp_path, "new.jsonl", [{**row, "candidates": {"bf16": {"us": 700.0},
                                                                "fp8w_tma": {"us": 400.0, "ok": True, "err_max": 4e-3}}}])
    lines, _ = ft.load_lines([old, new])
    tma = _line(lines, 4096, "multi-launch: fp8w_tma")
    assert (tma["mode"], tma["us"], tma["source"]) == ("weights", 400.0, "new") and ft.target(tma)[1]
    m128 = _line(lines, 4096, "multi-launch: fp8a_m128")  # only the old file has it: kept, shown as failed
    assert m128["mode"] == "weights+act" and m128["us"] is None and ft.target(m128) is None
    lines, _ = ft.load_lines([new, old])  # the other order: the old row wins
    assert _line(lines, 4096, "multi-launch: fp8w_tma")["us"] == 1250.0


def test_md_output_and_missing_file(tmp_path, capsys):
    rows = _write(tmp_path, "mk.jsonl", [_decode(1, "uniform", 16.0, 40.0, 32.0, commit_note="tree was abc1234")])
    md = tmp_path / "t.md"
    assert ft.main([rows, "--md", str(md)]) == 0
    out = capsys.readouterr().out
    assert out == md.read_text() and out.startswith("| preset | T |")
    assert "Commit note in the rows: tree was abc1234" in out
    with pytest.raises(SystemExit):
        ft.main([str(tmp_path / "none.jsonl")])
