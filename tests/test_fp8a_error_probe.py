"""benchmarks/fp8a_error_probe.py's CPU smoke: one case, one seed, every tile set, under the interpreter."""

from __future__ import annotations

import json
import math

import pytest
import torch
from benchload import load_benchmark

FIELDS = ("err_max", "err_rms", "limit_max", "limit_rms", "h_code_diff", "h_code_diff_frac", "h_code_steps_max",
          "h_value_diff", "h_scale_diff", "h_scale_rel_max", "gemm2_max", "gemm2_rms", "gemm2_rounded_max",
          "gemm2_rounded_rms", "codes_max", "codes_rms", "x_code_diff", "h_pre_steps_max")


@pytest.mark.interpret
@pytest.mark.filterwarnings("ignore:invalid value encountered in matmul:RuntimeWarning")
def test_cpu_smoke_writes_finite_rows(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the GPU run is the probe itself")
    probe = load_benchmark("fp8a_error_probe")
    assert probe.main(["--out", str(tmp_path), "--cpu-smoke", "--cases", "odd", "--seeds", "1"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(r["case"], r["tiles"], r["seed"]) for r in rows] == [("odd", t, 0) for t in probe.TILES]
    for r in rows:
        assert all(math.isfinite(r[k]) for k in FIELDS), r
        assert r["written"] and r["ok"] and r["gpu"] == "cpu-interpreter", r
