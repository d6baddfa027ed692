"""benchmarks/bench_ep.py --predict-only without GPUs: the fused layer's prediction rows of one tiny case,
beside the bulk-synchronous prediction."""

from __future__ import annotations

import json

import pytest
from benchload import load_benchmark


def test_one_tiny_case_writes_fused_and_bulk_rows(tmp_path, capsys):
    out = tmp_path / "fused.jsonl"
    rc = load_benchmark("bench_ep").main(["--predict-only", "--transport", "fused", "--ranks", "2", "--tokens", "16",
                                          "--routing", "skewed", "--placement", "contiguous",
                                          "--max-rows", "auto,none", "--out", str(out)])
    assert rc == 0
    every = [json.loads(s) for s in out.read_text().splitlines()]
    assert [r["schedule"] for r in every] == ["bulk", "fused_ep", "fused_ep"]  # the bulk row first, once
    rows = every[1:]
    assert [r["max_rows"] for r in rows] == [1, "none"]  # auto: the most rows a rank receives over 132 programs
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and all("fused" in s and "bulk" in s for s in printed)
    for r in rows:
        assert r["kind"] == "prediction" and r["schedule"] == "fused_ep" and r["system"] == "hgx-h200"
        assert r["ranks"] == 2 and r["tokens_per_rank"] == 16 and r["programs"] == 132
        assert r["bulk"]["schedule_matches_simulator"] is True and r["bulk"]["predicted_layer_us"] > 0
        assert r["predicted_layer_us"] == pytest.approx(sum(r["terms_us"].values()))
        assert r["terms_us"]["fused"] == pytest.approx(max(r["fused_launch_us"]))
        assert set(r["slowest_span_us"]) <= {"pull", "gemm1", "gemm2", "push"} and r["slowest_link_bytes"] > 0
        assert len(r["tiles"]) == 2 and all(t["BM"] >= 16 for t in r["tiles"])
    # cut into one-row copies, the pulls spread over the programs: no slower than one copy per peer
    assert rows[0]["terms_us"]["fused"] <= rows[1]["terms_us"]["fused"]


@pytest.mark.parametrize("argv", [["--max-rows", "0"], ["--max-rows", "many"], ["--ranks", "0"]],
                         ids=["zero-rows", "word", "zero-ranks"])
def test_bad_arguments_are_refused(argv):
    with pytest.raises(SystemExit) as e:
        load_benchmark("bench_ep").main(["--predict-only", *argv])
    assert e.value.code == 2
