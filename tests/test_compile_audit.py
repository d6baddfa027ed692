"""benchmarks/compile_audit.py's bookkeeping on a tiny layer, with a fake compile (nothing compiled): every
launch of the multi-launch path is found, equal launches are compiled once with all their cases, and a
result past an H200 block's limits is flagged. The recording needs kernels defined without the
interpreter, so the audit runs in a subprocess without TRITON_INTERPRET."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchload import load_benchmark

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

_AUDIT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import compile_audit as ca
from megamoe.reference import MoEConfig

cfg = MoEConfig(hidden_size=256, intermediate_size=128, num_experts=8, top_k=2, num_shared_experts=1,
                shared_intermediate_size=128, name="tiny")
calls = []

def fake(spec):
    calls.append(ca.spec_key(spec))
    big = {"_combine_kernel": 300000, "_router_kernel": 232448}.get(spec["kernel"], 1024)
    if spec["kernel"] == "_layout_kernel":
        return {"error": "CompilationError: boom", "compile_s": 0.0}
    return {"shared": big, "regs": 256 if spec["kernel"] == "_scan_experts_kernel" else 40, "sass.STL": 0,
            "compile_s": 0.0}

entries = ca.collect({"tiny": cfg}, [1, 2, 40], ["bf16"], megakernel=False, log=lambda s: None)
per_case = {T: [k[0].__name__ for k in ca.layer_launches(cfg, T, None)] for T in (1, 2, 40)}
ca.audit(entries, compile_fn=fake, jobs=0, log=lambda s: None)
skipped = ca.collect({"tiny": cfg}, [1], ["bf16"], megakernel=False, log=lambda s: None)
ca.audit(skipped, compile_fn=fake, jobs=0, budget=0.0, t0=0.0, log=lambda s: None)
from triton.runtime.jit import JITFunction
from megamoe.kernels import routing
print(json.dumps({"entries": [ca.row(e) for e in entries], "calls": calls, "per_case": per_case,
                  "skipped": [e["status"] for e in skipped], "md": ca.summary([ca.row(e) for e in entries]),
                  "restored": JITFunction.run is not None and "recording" not in JITFunction.run.__qualname__}))
"""


def _run_audit() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH.parent), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _AUDIT, str(BENCH)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_audit_dedups_compiles_and_flags_past_the_h200_limits():
    out = _run_audit()
    rows, calls = out["entries"], out["calls"]
    # every launch of each case is an entry's; the layer with a shared MLP launches router, align, routed and
    # shared GEMMs and the combine
    for T, kernels in out["per_case"].items():
        assert {"_router_kernel", "_combine_kernel"} <= set(kernels)
        assert sum(1 for k in kernels if "gemm" in k) == 4, kernels
        for k in set(kernels):
            assert any(r["kernel"] == k and f"tiny:{T}:bf16" in r["cases"] for r in rows), (T, k)
    # each distinct launch compiled once; launches shared by the cases are not compiled again
    assert len(calls) == len(set(calls)) == len(rows)
    total = sum(len(k) for k in out["per_case"].values())
    assert len(calls) < total
    shared_by_all = [r for r in rows if len(r["cases"]) == 3]
    assert shared_by_all, "no launch found common to T = 1, 2 and 40"
    by = {r["kernel"]: r for r in rows}
    # flags: shared past 232448 (the limit itself fits), registers past 255, a compile error
    assert by["_combine_kernel"]["status"] == "flagged" and "OutOfResources" in by["_combine_kernel"]["flags"][0]
    assert all(r["status"] == "ok" for r in rows if r["kernel"] == "_router_kernel")
    assert by["_scan_experts_kernel"]["flags"] == ["registers 256 > 255"]
    assert by["_layout_kernel"]["status"] == "flagged" and "compile error" in by["_layout_kernel"]["flags"][0]
    assert all(r["status"] == "ok" for r in rows if "gemm" in r["kernel"])
    assert "Sizes chosen by plan.combine_launch" in out["md"]
    # past the budget nothing is compiled, everything is listed as skipped
    assert out["skipped"] and set(out["skipped"]) == {"skipped"}
    assert "## Flagged" in out["md"] and "_combine_kernel" in out["md"].split("## Every")[0]
    assert out["restored"]


def test_flags_occupancy_and_limits():
    ca = load_benchmark("compile_audit")  # the environment as it was: compile_audit drops TRITON_INTERPRET

    spec = {"num_warps": 8, "num_stages": 3}
    assert ca.flags({"spec": spec, "shared": 232448, "regs": 255}) == []
    assert ca.flags({"spec": spec, "shared": 232449, "regs": 100})[0].startswith("shared 232449 > 232448")
    # a persistent megakernel of occupancy 2 needs two blocks on an SM: 120 KB of shared each cannot
    assert ca.flags({"spec": spec, "shared": 120000, "regs": 128, "occupancy": 2})[0].startswith("occupancy 2")
    assert ca.flags({"spec": spec, "shared": 100000, "regs": 128, "occupancy": 2}) == []
    assert ca.flags({"spec": spec, "shared": 1000, "regs": 168, "occupancy": 2})[0].startswith("occupancy 2")
    assert ca.resident_programs(0, 64, 4) == 8  # 64 x 32 x 4 registers a block
    assert ca.flags({"spec": None, "build_error": "x", "cases": ["a"]}) == []


def test_rows_read_back_and_summarize_joined(tmp_path):
    """Rows written (gzip) and read back are the same; --render joins audit files into one summary."""
    ca = load_benchmark("compile_audit")  # the environment as it was: compile_audit drops TRITON_INTERPRET

    rows = [{"kernel": "_megakernel", "path": "megakernel", "status": "flagged", "flags": ["shared 327680 > 232448"],
             "shared": 327680, "regs": 255, "spill_stores": 3, "num_warps": 8, "num_stages": 4, "cases": ["a:512:weights"],
             "constexprs": {"BM": 64, "BN2": 256, "SPF": False}},
            {"kernel": "_megakernel", "path": "megakernel", "status": "ok", "shared": 1024, "regs": 40,
             "num_warps": 4, "num_stages": 3, "cases": ["a:1:bf16"], "constexprs": {"BM": 16, "BN2": 256, "SPF": False}}]
    ca.write(rows, str(tmp_path / "one"), "h", gz=True)
    assert ca.read(str(tmp_path / "one" / "audit.jsonl.gz")) == rows
    old = {**rows[1], "chosen_by": "x", "flags": [], "error": None, "constexprs": {"BM": 16, "X": None}}
    assert ca.normalize(old) == {**rows[1], "constexprs": {"BM": 16}}
    md = ca.summary(rows)
    flagged, table = md.split("## Near")[0], md.split("## Every")[1]
    assert "BN2=256 SPF=False" in flagged and "a:512:weights" in flagged
    assert "BM=16 |" in table and "BN2" not in table  # the table shows the constexprs that vary
