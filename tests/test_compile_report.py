"""benchmarks/compile_report.py without compiling: the SASS loop summary it prints with --loops."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def _report():
    """The module, loaded with the environment kept: it drops TRITON_INTERPRET on import (to compile
    for the GPU), which processes this test run spawns later must still inherit."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_report.py"
    spec = importlib.util.spec_from_file_location("compile_report", path)
    mod = importlib.util.module_from_spec(spec)
    saved = dict(os.environ)
    try:
        spec.loader.exec_module(mod)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return mod


SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
	//## File "/w/kernels/fp8_gemm.py", line 190
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R4.64] ;
        /*0020*/                   DEPBAR.LE SB0, 0x4 ;
        /*0030*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
.L_x_2:
	//## File "/w/kernels/fp8_gemm.py", line 199
        /*0040*/                   F2FP.F16.E4M3.UNPACK_B R6, R7 ;
        /*0050*/                   F2F.BF16.F16 R8, R6 ;
        /*0060*/                   HMMA.16816.F32.BF16 R10, R12, R8, R10 ;
        /*0070*/               @P0 BRA `(.L_x_2) ;
        /*0080*/                   LDG.E R9, desc[UR4][R4.64] ;
        /*0090*/               @P1 BRA `(.L_x_1) ;
"""


def test_loop_report_counts_the_innermost_loop():
    """Only the innermost loop (.L_x_2, inside .L_x_1) is reported, with its source line."""
    loops = _report().loop_report(SASS)
    assert [lp["label"] for lp in loops] == [".L_x_2"]
    lp = loops[0]
    assert lp["source"] == "fp8_gemm.py:199" and lp["instructions"] == 4
    assert (lp["HMMA"], lp["F2F"], lp["F2FP"], lp["LDGSTS"], lp["LDG"]) == (1, 1, 1, 0, 0)
