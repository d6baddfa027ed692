"""benchmarks/repredict_runs.py: stored validation runs re-predicted and summarized (no GPU)."""

from __future__ import annotations

import pytest
from benchload import load_benchmark

rr = load_benchmark("repredict_runs")


def test_summary_counts_by_backend_and_threshold():
    """Median and max of |error|, rows outside 15% and 10%, each backend's median (the last key
    field is the backend, also in pooled keys that start with the run)."""
    err = {("a", 1, "u", "multi"): 0.02, ("a", 8, "u", "multi"): -0.12, ("a", 1, "u", "megakernel"): 0.20,
           ("58", "a", 8, "u", "megakernel"): -0.04}
    s = rr.summary(err)
    assert "median 8.0%" in s and "max 20.0%" in s and "outside 15% 1" in s and "outside 10% 2" in s
    assert "megakernel 12.0%" in s and "multi 7.0%" in s and "(4 rows)" in s


def test_unknown_run_names_the_runs_stored():
    with pytest.raises(SystemExit, match="no results/validation_\\*_run9999 folder; the runs stored: .*58"):
        rr.run_dir("9999")


@pytest.mark.skipif(not (rr.RESULTS / "validation_2026-12-02_run61").exists(), reason="stored run 61 not here")
def test_a_stored_run_repredicts_with_its_own_profile():
    """Run BI's rows, re-predicted with its own profile under today's code: all 108, each within
    100% of its measurement."""
    err = rr.repredicted("61", {})
    assert len(err) == 108 and all(abs(v) < 1.0 for v in err.values())
