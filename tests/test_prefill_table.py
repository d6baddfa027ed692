"""benchmarks/prefill_table.py (issue 10's table from stored rows, no GPU) and the table_rows.py it
shares with megakernel_table.py, on small synthetic rows."""

from __future__ import annotations

import json

import pytest
from benchload import load_benchmark

BASE = {"gpu": "G", "torch": "t", "triton": "3.6.0", "commit": "abcdef0123", "date": "2026-12-02T10:00:00+00:00"}
RBASE = {**BASE, "commit": "1234567890", "date": "2026-12-03T01:00:00+00:00"}


def _row(preset, T, floor, ideal, torch_us, us, ok=True, **cand):
    c = {"us": us, "ok": ok, "err_max": 3e-3 if ok else 0.5, "over_floor": us / floor, **cand}
    return {**BASE, "preset": preset, "T": T, "floor_us": floor, "ideal_us": ideal, "torch_us": torch_us,
            "candidates": {"current": c}}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _line(text, preset, T):
    return next(ln for ln in text.splitlines() if ln.startswith(f"| {preset} | {T} |"))


@pytest.fixture
def pt():
    return load_benchmark("prefill_table")


def test_router_share_by_the_rows_vintage(pt):
    """The default router's router + align over the layer: "default_*" keys (run 47 on), the tag in
    "default" (run 46), the tiles where "prefill_router" (run 42), else not known."""
    new = {"default_router_align_us": 3.0, "tiles_router_align_us": 9.0, "layer_us": 100.0}
    named = {"default": "walk", "walk_router_align_us": 4.0, "tiles_router_align_us": 9.0, "layer_us": 100.0}
    old = {"prefill_router": True, "walk_router_align_us": 4.0, "tiles_router_align_us": 6.0, "layer_us": 200.0}
    assert [pt.default_tag(r) for r in (new, named, old)] == ["default", "walk", "tiles"]
    assert pt.router_share(new) == pytest.approx(3.0) and pt.router_share(named) == pytest.approx(4.0)
    assert pt.router_share(old) == pytest.approx(3.0)
    assert pt.default_tag({"prefill_router": False}) is None and pt.router_share({"layer_us": 1.0}) is None
    assert pt.router_share(None) is None


def test_targets_met_missed_failed_and_not_measured(pt):
    """Each T's targets: 0.85 of the ideal rate at 4096 / 16384, 1.25 x floor at 512, faster than
    PyTorch always, router + align <= 3% from 4096; a gap where missed, "not measured" where a
    figure is absent, every target about ours missed where ours failed."""
    r = _row("mixtral-8x7b", 4096, 100.0, 90.0, 150.0, 100.0)
    assert pt.targets(r, 100.0, 2.0) == [("ideal rate >= 0.85", True, "0.90"),
                                         ("faster than PyTorch", True, "1.50x"),
                                         ("router + align <= 3%", True, "2.0%")]
    r = _row("qwen3-30b-a3b", 512, 100.0, 110.0, None, 130.0)
    assert pt.targets(r, 130.0, 9.0) == [("<= 1.25 x floor", False, "1.30x; ours needs 4% less time"),
                                         ("faster than PyTorch", None, "not measured")]
    r = _row("deepseek-v3", 16384, 100.0, 80.0, 90.0, 100.0)
    ts = pt.targets(r, 100.0, 3.5)
    assert ts == [("ideal rate >= 0.85", False, "0.80; ours needs 6% less time"),
                  ("faster than PyTorch", False, "0.90x; ours needs 10% less time"),
                  ("router + align <= 3%", False, "3.5%; 0.5 points over")]
    assert pt.targets(r, None, None, failed=True) == [("ideal rate >= 0.85", False, "ours failed"),
                                                      ("faster than PyTorch", False, "ours failed"),
                                                      ("router + align <= 3%", None, "not measured")]


def test_table_from_files(pt, tmp_path, capsys):
    """The table over two prefill files and two router files, the later file's row where a (preset,
    T) repeats; ratios from the stored us (not the stored over_ideal_rate); a failed candidate shown
    as failed; the count, the provenance of both kinds, the grid's rows not measured."""
    old = _write(tmp_path / "old.jsonl", [
        _row("qwen3-30b-a3b", 4096, 100.0, 150.0, 180.0, 100.0),  # replaced below
        _row("mixtral-8x7b", 4096, 100.0, 90.0, 150.0, 100.0, over_ideal_rate=0.1),
    ])
    new = _write(tmp_path / "new.jsonl", [
        _row("qwen3-30b-a3b", 4096, 100.0, 150.0, 180.0, 200.0),
        _row("qwen3-30b-a3b", 512, 100.0, 110.0, None, 130.0),
        _row("deepseek-v3", 16384, 100.0, 80.0, 90.0, 100.0, ok=False),
    ])
    r_old = _write(tmp_path / "r_old.jsonl", [
        {**BASE, "preset": "qwen3-30b-a3b", "T": 4096, "prefill_router": True, "tiles_router_align_us": 1.0,
         "layer_us": 100.0},  # replaced below
        {**BASE, "preset": "mixtral-8x7b", "T": 4096, "prefill_router": True, "tiles_router_align_us": 2.0,
         "layer_us": 100.0},
    ])
    r_new = _write(tmp_path / "r_new.jsonl", [
        {**RBASE, "preset": "qwen3-30b-a3b", "T": 4096, "default_router_align_us": 10.0, "layer_us": 200.0},
        {**RBASE, "preset": "qwen3-30b-a3b", "T": 512, "default_router_align_us": 9.0, "layer_us": 100.0},
        {**RBASE, "preset": "qwen3-30b-a3b", "T": 64, "default_router_align_us": 9.0, "layer_us": 100.0},
    ])
    md = tmp_path / "out.md"
    assert pt.main([old, new, "--router", r_old, r_new, "--md", str(md)]) == 0
    text = capsys.readouterr().out
    assert md.read_text() == text
    lines = [ln for ln in text.splitlines() if ln.startswith("| ") and not ln.startswith("| preset")]
    assert [ln.split(" | ")[:2] for ln in lines] == [["| mixtral-8x7b", "4096"], ["| qwen3-30b-a3b", "512"],
                                                     ["| qwen3-30b-a3b", "4096"], ["| deepseek-v3", "16384"]]
    mix = _line(text, "mixtral-8x7b", 4096)
    assert "| 100.0 | 150.0 | 1.00 | 0.90 | 1.50 | 2.0% |" in mix and "ideal rate >= 0.85: yes (0.90)" in mix
    q4 = _line(text, "qwen3-30b-a3b", 4096)
    assert "| 200.0 |" in q4 and "| 0.75 | 0.90 | 5.0% |" in q4
    assert "router + align <= 3%: no (5.0%; 2.0 points over)" in q4
    q512 = _line(text, "qwen3-30b-a3b", 512)
    assert "| 9.0% |" in q512 and "faster than PyTorch: not measured" in q512 and "router" not in q512.split("|")[-2]
    ds = _line(text, "deepseek-v3", 16384)
    assert "| failed |" in ds and "current failed numerics (err_max 5.0e-01)" in ds
    assert "ideal rate >= 0.85: no (ours failed)" in ds and "router + align <= 3%: not measured" in ds
    assert "Targets met: 3 of 9 (ours: the current candidate; 2 more not measured)." in text
    assert "Measured on: G, torch t, Triton 3.6.0, commit abcdef0, 2026-12-02." in text
    assert "Router + align (no combine) measured on: G, torch t, Triton 3.6.0, commit 1234567, 2026-12-03; " \
           "G, torch t, Triton 3.6.0, commit abcdef0, 2026-12-02." in text
    assert "Not measured: mixtral-8x7b T = 512, mixtral-8x7b T = 16384, qwen3-30b-a3b T = 16384, " in text
    assert "deepseek-v3 T = 4096." in text and "deepseek-v3 T = 16384," not in text


def test_another_candidate_and_missing_files(pt, tmp_path):
    """--candidate shows another candidate as ours; a row without it is neither a time nor a failure
    (its targets about ours not measured); a rows file that is not there is refused."""
    r = _row("mixtral-8x7b", 16384, 100.0, 90.0, 150.0, 120.0)
    r["candidates"]["tma128"] = {"us": 100.0, "ok": True, "err_max": 3e-3}
    text = pt.table([r, _row("mixtral-8x7b", 4096, 100.0, 90.0, 150.0, 100.0)], candidate="tma128")
    assert "| 100.0 | 150.0 | 1.00 | 0.90 | 1.50 |" in _line(text, "mixtral-8x7b", 16384)
    other = _line(text, "mixtral-8x7b", 4096)
    assert "| - | 150.0 |" in other and "no tma128 candidate" in other and "failed" not in other
    assert "Targets met: 2 of 2 (ours: the tma128 candidate; 4 more not measured)." in text
    with pytest.raises(SystemExit):
        pt.main([str(tmp_path / "absent.jsonl")])


def test_table_rows_helpers(tmp_path):
    """table_rows.py: the later line / file wins per key, refused rows replace nothing; "-" for no
    figure; the markdown rule as wide as the header; the provenance sorted and distinct."""
    tr = load_benchmark("table_rows")
    a = _write(tmp_path / "a.jsonl", [{"k": 1, "v": "a1"}, {"k": 2, "v": "a2"}, {"k": 1, "v": "a1b"}])
    b = tmp_path / "b.jsonl"
    b.write_text(json.dumps({"k": 2, "v": "b2"}) + "\n\n" + json.dumps({"k": 1, "v": "skip", "fp8": 1}) + "\n")
    got = tr.load_keyed([a, str(b)], lambda r: r["k"], keep=lambda r: not r.get("fp8"))
    assert {k: r["v"] for k, r in got.items()} == {1: "a1b", 2: "b2"}
    assert [tr.fmt(None), tr.fmt(float("nan")), tr.fmt(1234.56), tr.fmt(0.5, "{:.2f}")] == ["-", "-", "1,234.6", "0.50"]
    assert tr.md_table(["a", "b"], [["1", "2"]]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    rows = [RBASE, BASE, {**BASE, "commit": "abcdef0999"}, {"gpu": None}]
    assert tr.provenance(rows) == ("None, torch None, Triton None, commit , ; G, torch t, Triton 3.6.0, commit 1234567, "
                                   "2026-12-03; G, torch t, Triton 3.6.0, commit abcdef0, 2026-12-02")
